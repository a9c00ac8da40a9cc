//! `octoflow devices`: the Vulkan devices and the capabilities our kernels choose variants by.

use anyhow::Context as _;
use octoflow_vk::{choose_device, list_devices, DeviceCaps, DeviceChoice, GPU_ENV};
use serde_json::json;
use std::fmt::Write as _;
use std::io::Write as _;

/// Arguments of `octoflow devices`.
#[derive(clap::Args)]
pub struct Args {
    /// Mark this device index as the one to use (as `--gpu` does for other commands).
    #[arg(long)]
    gpu: Option<usize>,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

/// Runs `octoflow devices`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let devices = list_devices().context("listing Vulkan devices")?;
    let choice = args.gpu.map_or(DeviceChoice::Auto, DeviceChoice::Index);
    // A bad --gpu/OCTOFLOW_GPU is reported, but the list is still worth printing.
    let chosen = choose_device(&devices, choice);
    let mut out = String::new();
    if args.json {
        let doc = json!({ "chosen": chosen.as_ref().ok(), "devices": devices });
        out = serde_json::to_string_pretty(&doc)? + "\n";
    } else {
        let _ = writeln!(
            out,
            "Vulkan devices (* = used by default; choose with --gpu N or {GPU_ENV}=N):"
        );
        for d in &devices {
            let mark = if chosen.as_ref().ok() == Some(&d.index) {
                '*'
            } else {
                ' '
            };
            print_device(&mut out, mark, d);
        }
    }
    // A closed pipe (`| head`) is not an error worth reporting.
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    chosen.map(|_| ()).context("choosing a device")
}

fn print_device(out: &mut String, mark: char, d: &DeviceCaps) {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let sg = &d.subgroup;
    let _ = writeln!(
        out,
        "{mark} [{}] {}  ({}, Vulkan {})",
        d.index, d.name, d.kind, d.api_version
    );
    let _ = writeln!(
        out,
        "      {:<19}{} / {}",
        "driver", d.driver_name, d.driver_info
    );
    let _ = writeln!(
        out,
        "      {:<19}size {} (required sizes {}..={}: {}; full subgroups: {}); ops: {}",
        "subgroup",
        sg.size,
        sg.min_size,
        sg.max_size,
        yes(sg.size_control),
        yes(sg.full_subgroups),
        sg.ops.join(" ")
    );
    let _ = writeln!(
        out,
        "      {:<19}fp16 {}, int8 {}, int16 {}, integer dot product {} (int8 accelerated: {})",
        "arithmetic",
        yes(d.shader_float16),
        yes(d.shader_int8),
        yes(d.shader_int16),
        yes(d.integer_dot_product),
        yes(d.int8_dot_accelerated)
    );
    let _ = writeln!(
        out,
        "      {:<19}16-bit {}, 8-bit {}",
        "storage",
        yes(d.storage_16bit),
        yes(d.storage_8bit)
    );
    match &d.cooperative_matrix {
        None => {
            let _ = writeln!(out, "      {:<19}no", "coopmat (KHR)");
        }
        Some(shapes) => {
            let _ = writeln!(out, "      {:<19}{} shapes", "coopmat (KHR)", shapes.len());
            for s in shapes {
                let _ = writeln!(
                    out,
                    "      {:<19}  {}x{}x{} {}·{} + {} -> {} ({}{})",
                    "",
                    s.m,
                    s.n,
                    s.k,
                    s.a,
                    s.b,
                    s.c,
                    s.result,
                    s.scope,
                    if s.saturating { ", saturating" } else { "" }
                );
            }
        }
    }
    let _ = writeln!(
        out,
        "      {:<19}{}",
        "coopmat2 (NV)",
        yes(d.cooperative_matrix2)
    );
    let heaps: Vec<String> = d
        .heaps
        .iter()
        .map(|h| {
            format!(
                "{}{}",
                bytes(h.size),
                if h.device_local { " device-local" } else { "" }
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "      {:<19}heaps {}; max allocation {}; max storage buffer {}",
        "memory",
        heaps.join(", "),
        bytes(d.max_allocation),
        bytes(d.max_storage_buffer_range)
    );
    let [x, y, z] = d.max_workgroup_count;
    let _ = writeln!(
                out,
        "      {:<19}shared {}; push constants {} B; workgroup <= {} invocations; groups <= {x}x{y}x{z}",
        "compute",
        bytes(u64::from(d.max_shared_memory)),
        d.max_push_constants,
        d.max_workgroup_invocations
    );
    let _ = writeln!(
        out,
        "      {:<19}{} ({} ns/tick, {} bits); buffer device address {}, timeline semaphores {}",
        "timestamps",
        yes(d.timestamps),
        d.timestamp_period_ns,
        d.timestamp_bits,
        yes(d.buffer_device_address),
        yes(d.timeline_semaphore)
    );
}

/// `1.5 GiB`, `32 KiB`, `100 B`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    let text = format!("{v:.1}");
    format!("{} {}", text.trim_end_matches(".0"), UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn sizes_print_in_binary_units() {
        assert_eq!(bytes(100), "100 B");
        assert_eq!(bytes(32 * 1024), "32 KiB");
        assert_eq!(bytes(128 << 20), "128 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
    }
}
