//! Helpers for tests that need a Vulkan device (here and in the kernel crates).

use crate::caps::DeviceCaps;
use crate::context::{Context, DeviceChoice};

/// Set to `1` to skip GPU tests on a machine without Vulkan; they then print a skip line.
pub const SKIP_ENV: &str = "OCTOFLOW_SKIP_GPU_TESTS";

/// A device for test `name`: `None` (after printing a skip line) when `OCTOFLOW_SKIP_GPU_TESTS=1`.
/// Without that variable a missing device fails the test with the reason, so a machine that
/// should run GPU tests can never pass them silently.
pub fn gpu_or_skip(name: &str) -> Option<Context> {
    if std::env::var(SKIP_ENV).is_ok_and(|v| v == "1") {
        println!("skipped {name}: {SKIP_ENV}=1");
        return None;
    }
    match Context::new(DeviceChoice::Auto) {
        Ok(ctx) => Some(ctx),
        Err(e) => panic!("{name} needs a Vulkan device: {e} (set {SKIP_ENV}=1 to skip GPU tests)"),
    }
}

/// [`gpu_or_skip`] for tests of the integer dot product kernels: `None` (with a line saying so)
/// where the device has no integer dot products.
pub fn gpu_with_integer_dot_or_skip(name: &str) -> Option<Context> {
    let ctx = gpu_or_skip(name)?;
    if !ctx.caps().integer_dot_product {
        println!(
            "skipped {name}: no integer dot products on {}",
            ctx.caps().name
        );
        return None;
    }
    Some(ctx)
}

/// Panics if the validation layer (on with `OCTOFLOW_VALIDATION=1`) reported errors.
pub fn assert_no_validation_errors(ctx: &Context) {
    let n = ctx.validation_errors();
    assert_eq!(
        n, 0,
        "{n} Vulkan validation error(s); see the log (OCTOFLOW_LOG=vulkan=warn)"
    );
}

/// Capabilities recorded from real devices (`fixtures/caps_*.json`, written by
/// `octoflow devices --json`): Mesa lavapipe 22.3.6 (CI) and the NVIDIA H100 80GB (driver
/// 580.159.04), in that order. For testing variant choices without the device.
pub fn recorded_caps() -> Vec<DeviceCaps> {
    [
        include_str!("../fixtures/caps_lavapipe.json"),
        include_str!("../fixtures/caps_h100.json"),
    ]
    .iter()
    .enumerate()
    .map(|(i, text)| {
        let mut caps: DeviceCaps =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("fixture {i}: {e}"));
        caps.index = i;
        caps
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::recorded_caps;
    use crate::{choose_device, DeviceChoice, DeviceKind};

    #[test]
    fn recorded_devices_describe_lavapipe_and_the_h100() {
        let [lavapipe, h100] = &recorded_caps()[..] else {
            panic!("two fixtures")
        };
        assert_eq!(
            (lavapipe.kind, h100.kind),
            (DeviceKind::Cpu, DeviceKind::Discrete)
        );
        assert!(
            h100.coopmat_supports(16, 16, 16, "f16", "f32")
                && !lavapipe.coopmat_supports(16, 16, 16, "f16", "f32")
        );
        assert_eq!((lavapipe.subgroup.size, h100.subgroup.size), (8, 32));
        assert_eq!(lavapipe.max_buffer_bytes(), 128 << 20);
        // 4 GiB allocations, but bindings stop 2 MiB short of 4 GiB.
        assert_eq!(h100.max_buffer_bytes(), (4 << 30) - (2 << 20));
        assert!(h100.cooperative_matrix2 && h100.int8_dot_accelerated);
    }

    #[test]
    fn a_machine_with_the_h100_and_lavapipe_opens_the_h100() {
        if std::env::var(crate::GPU_ENV).is_ok() {
            return println!("skipped: {} is set", crate::GPU_ENV);
        }
        assert_eq!(
            choose_device(&recorded_caps(), DeviceChoice::Auto).unwrap(),
            1
        );
        assert_eq!(
            choose_device(&recorded_caps(), DeviceChoice::Index(0)).unwrap(),
            0
        );
    }
}
