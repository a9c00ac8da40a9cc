//! Timing benchmarks of the linear kernels: the shared timing helpers and the whole-product
//! benchmarks here, the cooperative-matrix ones in coop_bench.rs and the matvec ones in
//! matvec_bench.rs (the decode attention's are in attention_decode_bench.rs, run by the same
//! command), and the ablation and probe shaders (`@bench` in shaders/variants.txt) only they use.
//!
//! A module of the library's unit tests (it times crate-private work layouts and variants),
//! compiled only with the `bench` feature, which also builds the benchmark-only shaders. Every
//! benchmark is an ignored test; run them all on the device with
//!
//! ```text
//! cargo test -p octoflow-kernels --release --features bench --lib -- --ignored --nocapture --test-threads=1
//! ```
//!
//! or one by name (`... --lib linear_timing -- --ignored --nocapture`); `LINEAR_BENCH=<filter>`
//! narrows the shapes where a benchmark says so.

use octoflow_gguf::GgmlType;
use octoflow_vk::testing::gpu_or_skip;
use octoflow_vk::{Buffer, Chain, Context, MemoryKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::linear::{Linear, LinearArgs, QWeightRef};
use crate::testkit::{buffer_with, random_weights};

/// utime + stime of this process (all threads), seconds.
pub(super) fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / 100.0
}

/// Wall time of single dispatches at model shapes, both layouts (`cargo test -p
/// octoflow-kernels --release --features bench --lib linear_timing -- --ignored --nocapture`; filter with
/// `LINEAR_BENCH=q4_1`).
#[test]
#[ignore]
fn linear_timing() {
    let Some(ctx) = gpu_or_skip("linear_timing") else {
        return;
    };
    let filter = std::env::var("LINEAR_BENCH").unwrap_or_default();
    let mut rng = StdRng::seed_from_u64(1);
    let cases = [
        (GgmlType::Q4_1, 576, 576, 64),
        (GgmlType::Q4_1, 576, 576, 1),
        (GgmlType::Q8_0, 8192, 576, 1),
        (GgmlType::Q4_1, 64, 64, 1),
        (GgmlType::Q4_K, 896, 4864, 64),
        (GgmlType::Q4_K, 896, 4864, 1),
        (GgmlType::Q6_K, 896, 4864, 1),
        (GgmlType::Q5_0, 896, 896, 1),
        (GgmlType::F16, 1000, 999, 1),
    ];
    for (ty, n_rows, n_cols, n_tokens) in cases {
        let name = format!("{ty} {n_rows}x{n_cols} x{n_tokens}");
        if !name.to_lowercase().contains(&filter) {
            continue;
        }
        let wq = random_weights(&mut rng, ty, n_rows, n_cols);
        let wb = buffer_with(&ctx, "w", &wq);
        let x: Vec<f32> = (0..n_tokens * n_cols).map(|_| rng.gen()).collect();
        let xb = buffer_with(&ctx, "x", octoflow_vk::as_bytes(&x));
        let yb = buffer_with(&ctx, "y", &vec![0u8; n_tokens * n_rows * 4]);
        for cpu in [false, true] {
            let lin = Linear::with_layout(&ctx, cpu, crate::Tuning::from_caps(ctx.caps())).unwrap();
            let args = LinearArgs {
                w: QWeightRef {
                    ty,
                    data: &wb.whole(),
                    n_rows: n_rows as u32,
                    n_cols: n_cols as u32,
                },
                x: &xb.whole(),
                y: &yb.whole(),
                n_tokens: n_tokens as u32,
                y_stride: n_rows as u32,
                y_col: 0,
                bias: None,
                accumulate: false,
                norm: None,
                pending: None,
            };
            // One dispatch to size the batch, then a chain of `n` (~0.3 s); the process CPU
            // time (all driver threads) is less noisy than wall time on a shared machine.
            let run = |n: usize| {
                let mut chain = Chain::new(&ctx).unwrap();
                for _ in 0..n {
                    lin.record(&mut chain, &args).unwrap();
                }
                let (t, c) = (std::time::Instant::now(), cpu_seconds());
                chain.run().unwrap();
                (
                    t.elapsed().as_secs_f64() / n as f64,
                    (cpu_seconds() - c) / n as f64,
                )
            };
            let n = (0.3 / run(1).0).clamp(1.0, 500.0) as usize;
            let (best, cpu_s) = run(n);
            let gmac = (n_rows * n_cols * n_tokens) as f64 / best / 1e9;
            println!(
                "{name:<24} cpu {cpu:<5} {:9.3} ms wall {:9.3} ms cpu {gmac:7.3} GMAC/s",
                best * 1e3,
                cpu_s * 1e3
            );
        }
    }
}

/// A chain of `reps` back-to-back recordings of `rec` (barriers between), replayed for a third
/// of a second: an idle GPU's clocks (an H100 idles at 345 MHz) take that long to come up.
pub(super) fn warmed(ctx: &Context, reps: usize, rec: &dyn Fn(&mut Chain)) -> Chain {
    let mut chain = Chain::new(ctx).unwrap();
    for _ in 0..reps {
        rec(&mut chain);
        chain.barrier().unwrap();
    }
    let t = std::time::Instant::now();
    while t.elapsed().as_secs_f64() < 0.33 {
        chain.run().unwrap();
    }
    chain
}

/// Median GPU time (ns) of `reps` back-to-back recordings of `rec` (GPU timestamps, barriers
/// between), or of the wall time per recording where the device has no timestamps. The chain
/// is replayed for a third of a second first: an idle GPU's clocks (an H100 idles at 345 MHz)
/// take that long to come up, and a cold measurement is several times too slow.
pub(super) fn gpu_ns(ctx: &Context, reps: usize, rec: &dyn Fn(&mut Chain)) -> f64 {
    warmed(ctx, reps, rec);
    let Ok(mut chain) = Chain::with_profiling(ctx) else {
        let mut chain = Chain::new(ctx).unwrap();
        for _ in 0..reps {
            rec(&mut chain);
            chain.barrier().unwrap();
        }
        let t = std::time::Instant::now();
        chain.run().unwrap();
        return t.elapsed().as_secs_f64() * 1e9 / reps as f64;
    };
    for _ in 0..reps {
        rec(&mut chain);
        chain.barrier().unwrap();
    }
    chain.run().unwrap();
    let mut ns: Vec<f64> = chain
        .timings()
        .unwrap()
        .unwrap()
        .iter()
        .map(|t| t.ns)
        .collect();
    ns.sort_by(f64::total_cmp);
    ns[ns.len() / 2]
}

/// Prints the driver's statistics (registers, shared memory, ...) of a `matmul_coop.comp`
/// pipeline.
pub(super) fn print_statistics(ctx: &Context, name: &str, shader: octoflow_vk::Shader) {
    let mut desc = octoflow_vk::PipelineDesc::new(shader, 5, crate::linear::PUSH_BYTES + 12)
        .subgroup_size(32)
        .capture_statistics();
    desc.full_subgroups = true;
    let p = octoflow_vk::Pipeline::new(ctx, &desc).unwrap();
    let stats: Vec<String> = p
        .statistics()
        .unwrap()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!("{name}: {}", stats.join(", "));
}

/// "ok" where an experiment's outputs match the reference variant's (1e-3), else what differs.
pub(super) fn verdict(got: &[f32], want: &[f32]) -> String {
    match crate::check_close(got, want, 1e-3) {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("WRONG ({e})"),
    }
}

/// Wall time (ns) per recording of `reps` back-to-back recordings of `rec` (barriers between,
/// one submit), after a third of a second of the same work: barriers inside a recording count.
pub(super) fn wall_ns(ctx: &Context, reps: usize, rec: &dyn Fn(&mut Chain)) -> f64 {
    let mut chain = warmed(ctx, reps, rec);
    let best = (0..5)
        .map(|_| {
            let t = std::time::Instant::now();
            chain.run().unwrap();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    best * 1e9 / reps as f64
}

/// Total GPU time (ns) per recording of `reps` back-to-back recordings of `rec` (every
/// dispatch of a recording summed: a split-K product and its sum), after the warm-up of
/// [`gpu_ns`].
pub(super) fn gpu_total_ns(ctx: &Context, reps: usize, rec: &dyn Fn(&mut Chain)) -> f64 {
    gpu_ns(ctx, 1, rec);
    let mut chain = Chain::with_profiling(ctx).unwrap();
    for _ in 0..reps {
        rec(&mut chain);
        chain.barrier().unwrap();
    }
    chain.run().unwrap();
    let total: f64 = chain.timings().unwrap().unwrap().iter().map(|t| t.ns).sum();
    total / reps as f64
}

/// The driver's statistics of every embedded shader (`cargo test -p octoflow-kernels --release --features bench --lib
/// pipeline_statistics -- --ignored --nocapture`): registers and local memory per invocation —
/// a kernel that spills, or indexes a private array with a variable, shows local memory (the
/// H100's driver reports it offset by 2^36). Built with 12 storage bindings and 128 bytes of
/// push constants (a superset of every shader's), specialization constants at their defaults.
#[test]
#[ignore]
fn pipeline_statistics() {
    use octoflow_vk::{Pipeline, PipelineDesc};
    let Some(ctx) = gpu_or_skip("pipeline_statistics") else {
        return;
    };
    for &shader in crate::shaders::ALL {
        let desc = PipelineDesc::new(shader, 12, 128).capture_statistics();
        let line = match Pipeline::new(&ctx, &desc).and_then(|p| p.statistics()) {
            Ok(stats) => stats
                .into_iter()
                .filter(|(k, _)| k.contains("Register") || k.contains("Local"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
            Err(e) => format!("not built: {e}"),
        };
        println!("{:<32} {line}", shader.name);
    }
}

/// What one dependent stage of a decode chain costs (`cargo test -p octoflow-kernels --release --features bench --lib
/// dispatch_overhead -- --ignored --nocapture`): host wall time per dispatch over a chain of
/// 2,000 replayed dispatches (the second of two runs) — a 32-element `add` with a
/// compute-to-compute barrier after each, with none, with a full barrier; single-token matvecs at
/// qwen2.5-0.5B shapes with compute barriers; and, on discrete GPUs, a grid-wide barrier inside
/// one dispatch (`grid_sync.comp`, one workgroup per SM at most) — the alternative to a
/// pipeline barrier for a persistent decode kernel.
#[test]
#[ignore]
fn dispatch_overhead() {
    use crate::add::Add;
    use octoflow_vk::{DeviceKind, Pipeline, PipelineDesc, Push};
    let Some(ctx) = gpu_or_skip("dispatch_overhead") else {
        return;
    };
    println!("device: {}", ctx.caps().name);
    let per_dispatch = |n: usize, rec: &dyn Fn(&mut Chain)| -> f64 {
        let mut chain = Chain::new(&ctx).unwrap();
        for _ in 0..n {
            rec(&mut chain);
        }
        chain.run().unwrap();
        let t = std::time::Instant::now();
        chain.run().unwrap();
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    };
    let add = Add::new(&ctx).unwrap();
    let a = buffer_with(&ctx, "a", &[0u8; 4096]);
    let b = buffer_with(&ctx, "b", &[0u8; 4096]);
    let (sa, sb) = (a.whole(), b.whole());
    let cpu = ctx.caps().kind == DeviceKind::Cpu;
    let n = if cpu { 20 } else { 2000 };
    let us = per_dispatch(n, &|c| {
        add.record(c, &sa, &sa, &sb, 32).unwrap();
        c.compute_barrier().unwrap();
    });
    println!("add x32 + compute barrier      {us:7.2} us per dispatch");
    let us = per_dispatch(n, &|c| add.record(c, &sa, &sa, &sb, 32).unwrap());
    println!("add x32, no barrier            {us:7.2} us per dispatch");
    let us = per_dispatch(n, &|c| {
        add.record(c, &sa, &sa, &sb, 32).unwrap();
        c.barrier().unwrap();
    });
    println!("add x32 + full barrier         {us:7.2} us per dispatch");

    let lin = Linear::new(&ctx).unwrap();
    let mut rng = StdRng::seed_from_u64(3);
    for (ty, n_rows, n_cols) in [
        (GgmlType::Q5_0, 896, 896),
        (GgmlType::Q5_0, 128, 896),
        (GgmlType::Q5_0, 4864, 896),
        (GgmlType::Q4_K, 896, 4864),
        (GgmlType::Q8_0, 151936, 896),
    ] {
        let wb = buffer_with(&ctx, "w", &random_weights(&mut rng, ty, n_rows, n_cols));
        let x: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let xb = buffer_with(&ctx, "x", octoflow_vk::as_bytes(&x));
        let yb = Buffer::new(&ctx, "y", 4 * n_rows as u64, MemoryKind::DeviceLocal).unwrap();
        let args = LinearArgs {
            w: QWeightRef {
                ty,
                data: &wb.whole(),
                n_rows: n_rows as u32,
                n_cols: n_cols as u32,
            },
            x: &xb.whole(),
            y: &yb.whole(),
            n_tokens: 1,
            y_stride: n_rows as u32,
            y_col: 0,
            bias: None,
            accumulate: false,
            norm: None,
            pending: None,
        };
        let reps = if n_rows > 100_000 { n / 20 + 1 } else { n };
        let us = per_dispatch(reps, &|c| {
            lin.record(c, &args).unwrap();
            c.compute_barrier().unwrap();
        });
        let gbs = wb.size() as f64 / us / 1e3;
        println!("matvec {ty} {n_rows}x{n_cols} x1 + barrier {us:7.2} us ({gbs:6.0} GB/s)");
    }

    if cpu {
        println!("grid barrier: skipped on a CPU device (workgroups are not all resident)");
        return;
    }
    let pipe = Pipeline::new(&ctx, &PipelineDesc::new(crate::shaders::GRID_SYNC, 1, 4)).unwrap();
    let count = Buffer::new(&ctx, "count", 4, MemoryKind::DeviceLocal).unwrap();
    for groups in [1u32, 16, 66, 132] {
        let time = |iters: u32| {
            let mut chain = Chain::new(&ctx).unwrap();
            chain.fill(&count.whole(), 0).unwrap();
            chain.barrier().unwrap();
            chain
                .dispatch(
                    &pipe,
                    &[count.whole()],
                    &Push::new().u32(iters),
                    [groups, 1, 1],
                )
                .unwrap();
            chain.run().unwrap();
            let t = std::time::Instant::now();
            chain.run().unwrap();
            t.elapsed().as_secs_f64()
        };
        let iters = 20_000;
        let us = (time(iters) - time(0)) * 1e6 / f64::from(iters);
        println!("grid barrier, {groups:3} workgroups     {us:7.3} us per barrier");
    }
}

/// Wall time per FFN gated linear unit of few-token steps, fused ([`Linear::record_glu`], one
/// dispatch, one barrier) against the separate path (gate and up matvecs, a barrier,
/// [`crate::Glu`], a barrier), each repeated in one long chain so that launch and barrier costs
/// count (`cargo test -p octoflow-kernels --release --features bench --lib glu_timing -- --ignored --nocapture --test-threads
/// 1`; filter with `LINEAR_BENCH=q8_0`). Shapes: qwen2.5-0.5B's 4864 x 896 and smollm2-135M's
/// 1536 x 576 (K-quants: 1024 and 768 columns).
#[test]
#[ignore]
fn glu_timing() {
    use crate::glu::{Glu, GluOp};
    use crate::linear::LinearGluArgs;
    let Some(ctx) = gpu_or_skip("glu_timing") else {
        return;
    };
    let filter = std::env::var("LINEAR_BENCH").unwrap_or_default();
    let lin = Linear::new(&ctx).unwrap();
    let glu = Glu::new(&ctx).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    use GgmlType::*;
    for ty in [Q8_0, Q5_0, Q4_K, Q6_K, F16] {
        for (n_ff, n_embd) in [(4864u32, 896u32), (1536, 576)] {
            let n_cols = if ty.block_size() == 256 {
                n_embd.next_multiple_of(256)
            } else {
                n_embd
            };
            let name = format!("{ty} {n_ff}x{n_cols}");
            if !name.to_lowercase().contains(&filter) {
                continue;
            }
            let (rows, cols) = (n_ff as usize, n_cols as usize);
            let gq = random_weights(&mut rng, ty, rows, cols);
            let uq = random_weights(&mut rng, ty, rows, cols);
            let (gb, ub) = (buffer_with(&ctx, "gate", &gq), buffer_with(&ctx, "up", &uq));
            let x: Vec<f32> = (0..8 * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let xb = buffer_with(&ctx, "x", octoflow_vk::as_bytes(&x));
            let bytes = 4 * 8 * u64::from(n_ff);
            let g_out = Buffer::new(&ctx, "g", bytes, MemoryKind::DeviceLocal).unwrap();
            let u_out = Buffer::new(&ctx, "u", bytes, MemoryKind::DeviceLocal).unwrap();
            let w = |data| QWeightRef {
                ty,
                data,
                n_rows: n_ff,
                n_cols,
            };
            let (gw, uw) = (gb.whole(), ub.whole());
            for n_tokens in [1u32, 4, 8] {
                let fused = |chain: &mut Chain| {
                    let args = LinearGluArgs {
                        gate: w(&gw),
                        up: w(&uw),
                        x: &xb.whole(),
                        y: &g_out.whole(),
                        n_tokens,
                        op: GluOp::Silu,
                        norm: None,
                        pending: None,
                    };
                    lin.record_glu(chain, &args).unwrap();
                    chain.compute_barrier().unwrap();
                };
                let separate = |chain: &mut Chain| {
                    for (m, out) in [(w(&gw), &g_out), (w(&uw), &u_out)] {
                        let args = LinearArgs {
                            w: m,
                            x: &xb.whole(),
                            y: &out.whole(),
                            n_tokens,
                            y_stride: n_ff,
                            y_col: 0,
                            bias: None,
                            accumulate: false,
                            norm: None,
                            pending: None,
                        };
                        lin.record(chain, &args).unwrap();
                    }
                    chain.compute_barrier().unwrap();
                    let (g, u) = (g_out.whole(), u_out.whole());
                    glu.record(chain, &g, &u, &g, n_tokens * n_ff, GluOp::Silu)
                        .unwrap();
                    chain.compute_barrier().unwrap();
                };
                let wall = |rec: &dyn Fn(&mut Chain), reps: usize| {
                    let mut chain = Chain::new(&ctx).unwrap();
                    for _ in 0..reps {
                        rec(&mut chain);
                    }
                    let t = std::time::Instant::now();
                    chain.run().unwrap();
                    t.elapsed().as_secs_f64() * 1e6 / reps as f64
                };
                // size the chain to ~0.3 s, then the best of 3
                let reps = (0.3e6 / wall(&separate, 1)).clamp(1.0, 2000.0) as usize;
                let best = |rec: &dyn Fn(&mut Chain)| {
                    (0..3)
                        .map(|_| wall(rec, reps))
                        .fold(f64::INFINITY, f64::min)
                };
                let (f, s) = (best(&fused), best(&separate));
                println!(
                    "{name:<18} x{n_tokens}: fused {f:8.1} us, separate {s:8.1} us ({:.2}x)",
                    s / f
                );
            }
        }
    }
}

#[path = "coop_bench.rs"]
mod coop_bench;
#[path = "dot_bench.rs"]
mod dot_bench;
#[path = "matvec_bench.rs"]
mod matvec_bench;
