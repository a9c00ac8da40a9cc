//! Timing benchmarks of the linear kernels (the decode attention's are in
//! attention_decode_bench.rs, run by the same command), and the ablation and probe shaders (`@bench` in
//! shaders/variants.txt) that only they use.
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
use octoflow_vk::{Buffer, BufferSlice, Chain, Context, MemoryKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::linear::{Linear, LinearArgs, QWeightRef};
use crate::matmul_coop::MatmulCoop;
use crate::testkit::{buffer_with, random_weights};
use crate::GluOp;

/// utime + stime of this process (all threads), seconds.
fn cpu_seconds() -> f64 {
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
fn warmed(ctx: &Context, reps: usize, rec: &dyn Fn(&mut Chain)) -> Chain {
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
fn gpu_ns(ctx: &Context, reps: usize, rec: &dyn Fn(&mut Chain)) -> f64 {
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

/// GPU time of `matmul.comp`/`matvec.comp` (Linear without coopmat) against `matmul_coop.comp`
/// at qwen2.5-0.5B shapes (`cargo test -p octoflow-kernels --release --features bench --lib coop_timing -- --ignored
/// --nocapture --test-threads 1`; filter with `LINEAR_BENCH=q8_0`). Prints GFLOPS
/// (2·rows·cols·tokens per second) and the sum over one qwen layer's seven Q8_0 products.
#[test]
#[ignore]
fn coop_timing() {
    let Some(ctx) = gpu_or_skip("coop_timing") else {
        return;
    };
    let filter = std::env::var("LINEAR_BENCH").unwrap_or_default();
    let coop = MatmulCoop::supported(ctx.caps()).then(|| MatmulCoop::new(&ctx).unwrap());
    let plain = Linear::new(&ctx).unwrap().without_coop();
    let mut rng = StdRng::seed_from_u64(1);
    use GgmlType::*;
    let layer: [(u32, u32); 7] = [
        (896, 896),
        (128, 896),
        (128, 896),
        (896, 896),
        (4864, 896),
        (4864, 896),
        (896, 4864),
    ];
    let mut cases: Vec<(GgmlType, u32, u32, Vec<u32>)> = vec![
        (Q8_0, 896, 896, vec![1, 2, 4, 5, 8, 16, 32, 64, 128, 512]),
        (Q8_0, 128, 896, vec![32, 128, 512]),
        (Q8_0, 4864, 896, vec![8, 32, 128, 512]),
        (Q8_0, 896, 4864, vec![8, 32, 128, 512]),
        (Q8_0, 151936, 896, vec![32, 512]),
    ];
    // K-quant rows are multiples of 256 columns: 1024 stands in for 896.
    for ty in [F16, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K] {
        let k = if ty.block_size() == 256 { 1024 } else { 896 };
        cases.push((ty, 4864, k, vec![4, 8, 32, 128, 512]));
        cases.push((ty, k, 4864, vec![128, 512]));
    }
    let mut layer_ns = std::collections::HashMap::<(u32, &str), f64>::new();
    let mut layer_shapes = std::collections::HashMap::<u32, Vec<(u32, u32)>>::new();
    for (ty, n_rows, n_cols, tokens) in cases {
        let name = format!("{ty} {n_rows}x{n_cols}");
        if !name.to_lowercase().contains(&filter) {
            continue;
        }
        let wq = random_weights(&mut rng, ty, n_rows as usize, n_cols as usize);
        let wb = buffer_with(&ctx, "w", &wq);
        let max_t = *tokens.iter().max().unwrap_or(&1);
        let x: Vec<f32> = (0..(max_t * n_cols) as usize)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let xb = buffer_with(&ctx, "x", octoflow_vk::as_bytes(&x));
        let y_bytes = 4 * u64::from(max_t) * u64::from(n_rows);
        let yb = Buffer::new(&ctx, "y", y_bytes, MemoryKind::DeviceLocal).unwrap();
        for n_tokens in tokens {
            let args = LinearArgs {
                w: QWeightRef {
                    ty,
                    data: &wb.whole(),
                    n_rows,
                    n_cols,
                },
                x: &xb.whole(),
                y: &yb.whole(),
                n_tokens,
                y_stride: n_rows,
                y_col: 0,
                bias: None,
                accumulate: false,
                norm: None,
                pending: None,
            };
            let reps = if n_rows > 100_000 { 5 } else { 21 };
            let flop = 2.0 * f64::from(n_rows) * f64::from(n_cols) * f64::from(n_tokens);
            let base = gpu_ns(&ctx, reps, &|c| plain.record(c, &args).unwrap());
            let mut line = format!(
                "{name:<18} x{n_tokens:<4} plain {:9.1} us {:8.0} GFLOPS",
                base / 1e3,
                flop / base
            );
            let mut best = base;
            if let Some(mm) = &coop {
                let ns = gpu_ns(&ctx, reps, &|c| mm.record(c, &args).unwrap());
                line += &format!(
                    " | coop {:9.1} us {:8.0} GFLOPS  x{:.2}",
                    ns / 1e3,
                    flop / ns,
                    base / ns
                );
                best = ns;
            }
            println!("{line}");
            if ty == Q8_0 && layer.contains(&(n_rows, n_cols)) {
                let mult = layer.iter().filter(|&&s| s == (n_rows, n_cols)).count() as f64;
                *layer_ns.entry((n_tokens, "plain")).or_default() += mult * base;
                *layer_ns.entry((n_tokens, "coop")).or_default() += mult * best;
                layer_shapes
                    .entry(n_tokens)
                    .or_default()
                    .push((n_rows, n_cols));
            }
        }
    }
    if let Some(mm) = &coop {
        tile_experiments(&ctx, mm, &filter);
        f16_operand_experiments(&ctx, mm, &filter);
        glu_experiments(&ctx, mm, &filter);
    }
    // Only token counts measured at all four distinct layer shapes make a layer.
    let mut keys: Vec<_> = layer_ns.keys().copied().collect();
    keys.sort();
    keys.retain(|&(t, _)| layer_shapes.get(&t).is_some_and(|s| s.len() == 4));
    for (t, path) in keys {
        println!(
            "qwen Q8_0 layer (7 products) x{t} {path}: {:.1} us",
            layer_ns[&(t, path)] / 1e3
        );
    }
}

/// A Q5_0 product at a model shape for the tile benchmarks: random weights, inputs for up to
/// 512 tokens and an output buffer.
struct Q5Product {
    n_rows: u32,
    n_cols: u32,
    w: BufferSlice,
    x: BufferSlice,
    y: Buffer,
}

impl Q5Product {
    fn new(ctx: &Context, rng: &mut StdRng, n_rows: u32, n_cols: u32) -> Self {
        let wq = random_weights(rng, GgmlType::Q5_0, n_rows as usize, n_cols as usize);
        let x: Vec<f32> = (0..512 * n_cols as usize)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        Q5Product {
            n_rows,
            n_cols,
            w: buffer_with(ctx, "w", &wq).whole(),
            x: buffer_with(ctx, "x", octoflow_vk::as_bytes(&x)).whole(),
            y: Buffer::new(
                ctx,
                "y",
                4 * 512 * u64::from(n_rows),
                MemoryKind::DeviceLocal,
            )
            .unwrap(),
        }
    }

    /// The operands of `n_tokens` (at most 512), `y` written whole; `y` is the output slice.
    fn args<'a>(&'a self, y: &'a BufferSlice, n_tokens: u32) -> LinearArgs<'a> {
        LinearArgs {
            w: QWeightRef {
                ty: GgmlType::Q5_0,
                data: &self.w,
                n_rows: self.n_rows,
                n_cols: self.n_cols,
            },
            x: &self.x,
            y,
            n_tokens,
            y_stride: self.n_rows,
            y_col: 0,
            bias: None,
            accumulate: false,
            norm: None,
            pending: None,
        }
    }
}

/// GPU time of the Q5_0 tile experiments of `variants.txt` against the default tile, each
/// variant's outputs checked against the default's.
fn tile_experiments(ctx: &Context, default: &MatmulCoop, filter: &str) {
    use crate::shaders as s;
    let tiles = [
        ("m128n64k64", None, [128, 64, 64]),
        ("n128", Some(s::MATMUL_COOP_WIDE_Q5_0), [128, 128, 64]),
        ("k32", Some(s::MATMUL_COOP_X_K32_Q5_0), [128, 64, 32]),
        ("m64", Some(s::MATMUL_COOP_X_M64_Q5_0), [64, 64, 64]),
        ("nodeq", Some(s::MATMUL_COOP_X_NODEQ_Q5_0), [128, 64, 64]),
        ("nomma", Some(s::MATMUL_COOP_X_NOMMA_Q5_0), [128, 64, 64]),
        ("nox", Some(s::MATMUL_COOP_X_NOX_Q5_0), [128, 64, 64]),
        ("noload", Some(s::MATMUL_COOP_X_NOLOAD_Q5_0), [128, 64, 64]),
        (
            "nostore",
            Some(s::MATMUL_COOP_X_NOSTORE_Q5_0),
            [128, 64, 64],
        ),
        ("nobar", Some(s::MATMUL_COOP_X_NOBAR_Q5_0), [128, 64, 64]),
        ("wnodeq", Some(s::MATMUL_COOP_X_WNODEQ_Q5_0), [128, 128, 64]),
        ("wnox", Some(s::MATMUL_COOP_X_WNOX_Q5_0), [128, 128, 64]),
        (
            "wnoload",
            Some(s::MATMUL_COOP_X_WNOLOAD_Q5_0),
            [128, 128, 64],
        ),
        ("wnomma", Some(s::MATMUL_COOP_X_WNOMMA_Q5_0), [128, 128, 64]),
        (
            "wmmaonly",
            Some(s::MATMUL_COOP_X_WMMAONLY_Q5_0),
            [128, 128, 64],
        ),
        (
            "mmaonly",
            Some(s::MATMUL_COOP_X_MMAONLY_Q5_0),
            [128, 64, 64],
        ),
    ];
    for (name, shader) in [("m128n64k64", s::MATMUL_COOP_Q5_0)]
        .into_iter()
        .chain(tiles.iter().filter_map(|&(n, sh, _)| sh.map(|sh| (n, sh))))
    {
        print_statistics(ctx, name, shader);
    }
    let built: Vec<(&str, Option<MatmulCoop>)> = tiles
        .iter()
        .map(|&(name, shader, tile)| {
            (
                name,
                shader.map(|sh| MatmulCoop::with_shaders(ctx, &[sh], tile).unwrap()),
            )
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(2);
    for (n_rows, n_cols) in [(896u32, 896u32), (4864, 896), (896, 4864), (151936, 896)] {
        let name = format!("Q5_0 {n_rows}x{n_cols} tiles");
        if !name.to_lowercase().contains(filter) {
            continue;
        }
        let product = Q5Product::new(ctx, &mut rng, n_rows, n_cols);
        let (yb, ys) = (&product.y, product.y.whole());
        let y_bytes = yb.size();
        for n_tokens in [128u32, 512] {
            let args = product.args(&ys, n_tokens);
            let flop = 2.0 * f64::from(n_rows) * f64::from(n_cols) * f64::from(n_tokens);
            let outputs = (n_tokens * n_rows) as usize;
            let mut line = format!("{name:<26} x{n_tokens:<4}");
            let mut want = Vec::new();
            for (tile, mm) in &built {
                let mm = mm.as_ref().unwrap_or(default);
                ctx.fill(yb, 0, y_bytes, f32::NAN.to_bits()).unwrap();
                let ns = gpu_ns(ctx, 11, &|c| mm.record(c, &args).unwrap());
                let mut got = vec![0f32; outputs];
                ctx.download(yb, 0, &mut got).unwrap();
                let ok = if want.is_empty() {
                    want = got;
                    "ref".to_string()
                } else {
                    verdict(&got, &want)
                };
                line += &format!(" {tile} {:.1}us {:.0}GF {ok}", ns / 1e3, flop / ns);
            }
            println!("{line}");
        }
    }
}

/// GPU time of products whose operands are already f16 in memory (`WH`: weights dequantized to
/// f16 rows, `XH`: inputs in f16) against the Q5_0 default: the same f16-rounded operands reach
/// the tensor cores, so the outputs agree to rounding of the sums.
fn f16_operand_experiments(ctx: &Context, default: &MatmulCoop, filter: &str) {
    use crate::shaders as s;
    let variants = [
        ("wh", s::MATMUL_COOP_X_WH, [128, 64, 64], true, false),
        ("whxh", s::MATMUL_COOP_X_WHXH, [128, 64, 64], true, true),
        ("wwhxh", s::MATMUL_COOP_X_WWHXH, [128, 128, 64], true, true),
        (
            "wxh",
            s::MATMUL_COOP_X_WXH_Q5_0,
            [128, 128, 64],
            false,
            true,
        ),
    ];
    for (name, shader, _, _, _) in &variants {
        print_statistics(ctx, name, *shader);
    }
    let mut rng = StdRng::seed_from_u64(3);
    for (n_rows, n_cols) in [(896u32, 896u32), (4864, 896), (896, 4864)] {
        let name = format!("Q5_0 {n_rows}x{n_cols} f16 operands");
        if !name.to_lowercase().contains(filter) {
            continue;
        }
        let wq = random_weights(&mut rng, GgmlType::Q5_0, n_rows as usize, n_cols as usize);
        let mut wf = vec![0f32; (n_rows * n_cols) as usize];
        octoflow_gguf::quant::dequantize(GgmlType::Q5_0, &wq, &mut wf).unwrap();
        let wh: Vec<u16> = wf
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        let wq_b = buffer_with(ctx, "wq", &wq);
        let wh_b = buffer_with(ctx, "wh", octoflow_vk::as_bytes(&wh));
        let x: Vec<f32> = (0..512 * n_cols as usize)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        // f16 inputs in a buffer of the f32 inputs' size (the checks see f32 operands)
        let mut xh: Vec<u16> = x
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        xh.resize(2 * x.len(), 0);
        let x_b = buffer_with(ctx, "x", octoflow_vk::as_bytes(&x));
        let xh_b = buffer_with(ctx, "xh", octoflow_vk::as_bytes(&xh));
        let yb = Buffer::new(
            ctx,
            "y",
            4 * 512 * u64::from(n_rows),
            MemoryKind::DeviceLocal,
        )
        .unwrap();
        let ys = yb.whole();
        let (wq_s, wh_s, x_s, xh_s) = (wq_b.whole(), wh_b.whole(), x_b.whole(), xh_b.whole());
        let built: Vec<_> = variants
            .iter()
            .map(|&(n, sh, tile, wh, xh)| {
                (
                    n,
                    MatmulCoop::with_shaders(ctx, &[sh], tile).unwrap(),
                    wh,
                    xh,
                )
            })
            .collect();
        for n_tokens in [128u32, 512] {
            let args = |wh: bool, xh: bool| LinearArgs {
                w: QWeightRef {
                    ty: if wh { GgmlType::F16 } else { GgmlType::Q5_0 },
                    data: if wh { &wh_s } else { &wq_s },
                    n_rows,
                    n_cols,
                },
                x: if xh { &xh_s } else { &x_s },
                y: &ys,
                n_tokens,
                y_stride: n_rows,
                y_col: 0,
                bias: None,
                accumulate: false,
                norm: None,
                pending: None,
            };
            let flop = 2.0 * f64::from(n_rows) * f64::from(n_cols) * f64::from(n_tokens);
            let outputs = (n_tokens * n_rows) as usize;
            let run = |mm: &MatmulCoop, a: &LinearArgs| {
                ctx.fill(&yb, 0, yb.size(), f32::NAN.to_bits()).unwrap();
                let ns = gpu_total_ns(ctx, 11, &|c| mm.record(c, a).unwrap());
                let mut got = vec![0f32; outputs];
                ctx.download(&yb, 0, &mut got).unwrap();
                (ns, got)
            };
            let (ns, want) = run(default, &args(false, false));
            let mut line = format!(
                "{name:<30} x{n_tokens:<4} q5_0 {:.1}us {:.0}GF",
                ns / 1e3,
                flop / ns
            );
            for (n, mm, wh, xh) in &built {
                let (ns, got) = run(mm, &args(*wh, *xh));
                let ok = verdict(&got, &want);
                line += &format!(" {n} {:.1}us {:.0}GF {ok}", ns / 1e3, flop / ns);
            }
            println!("{line}");
        }
    }
}

/// Prints the driver's statistics (registers, shared memory, ...) of a `matmul_coop.comp`
/// pipeline.
fn print_statistics(ctx: &Context, name: &str, shader: octoflow_vk::Shader) {
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
fn verdict(got: &[f32], want: &[f32]) -> String {
    match crate::check_close(got, want, 1e-3) {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("WRONG ({e})"),
    }
}

/// Wall time (ns) per recording of `reps` back-to-back recordings of `rec` (barriers between,
/// one submit), after a third of a second of the same work: barriers inside a recording count.
fn wall_ns(ctx: &Context, reps: usize, rec: &dyn Fn(&mut Chain)) -> f64 {
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

/// The FFN's gate, up and activation at qwen2.5-0.5B's shape (`LINEAR_BENCH=glu cargo test -p
/// octoflow-kernels --release --features bench --lib coop_timing -- --ignored --nocapture`): two products, a barrier
/// and the GLU kernel against the fused tensor-core dispatch in each tile, wall time per
/// recording (barriers included), outputs compared.
fn glu_experiments(ctx: &Context, default: &MatmulCoop, filter: &str) {
    use crate::shaders as s;
    if !"glu 4864x896".contains(filter) {
        return;
    }
    let variants = [
        ("64x128", s::MATMUL_COOP_GLU_Q5_0, [64, 128, 64]),
        ("64x64", s::MATMUL_COOP_GLU_SMALL_Q5_0, [64, 64, 64]),
        ("128x64x32", s::MATMUL_COOP_X_GLU_Q5_0, [128, 64, 32]),
        ("64x128x32", s::MATMUL_COOP_X_GLUWK32_Q5_0, [64, 128, 32]),
    ];
    let built: Vec<_> = variants
        .iter()
        .map(|&(n, sh, tile)| {
            let t = crate::matmul_coop::Tiled::with_bindings(ctx, &[sh], tile, 6).unwrap();
            (n, t)
        })
        .collect();
    let glu = crate::Glu::new(ctx).unwrap();
    let (n_rows, n_cols) = (4864u32, 896u32);
    let mut rng = StdRng::seed_from_u64(4);
    let wg = random_weights(&mut rng, GgmlType::Q5_0, n_rows as usize, n_cols as usize);
    let wu = random_weights(&mut rng, GgmlType::Q5_0, n_rows as usize, n_cols as usize);
    let (wg_b, wu_b) = (buffer_with(ctx, "wg", &wg), buffer_with(ctx, "wu", &wu));
    let x: Vec<f32> = (0..512 * n_cols as usize)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let x_b = buffer_with(ctx, "x", octoflow_vk::as_bytes(&x));
    let bytes = 4 * 512 * u64::from(n_rows);
    let new = |name| Buffer::new(ctx, name, bytes, MemoryKind::DeviceLocal).unwrap();
    let (g_b, u_b, f_b) = (new("g"), new("u"), new("f"));
    let (wg_s, wu_s, x_s) = (wg_b.whole(), wu_b.whole(), x_b.whole());
    let (g_s, u_s, f_s) = (g_b.whole(), u_b.whole(), f_b.whole());
    let rb = octoflow_gguf::quant::quantized_size(GgmlType::Q5_0, n_cols as usize).unwrap() as u32;
    let ti = crate::qweight::TYPES
        .iter()
        .position(|&t| t == GgmlType::Q5_0)
        .unwrap();
    for n_tokens in [9u32, 16, 32, 64, 128, 256, 512] {
        fn product<'a>(
            w: &'a BufferSlice,
            x: &'a BufferSlice,
            y: &'a BufferSlice,
            shape: [u32; 3],
        ) -> LinearArgs<'a> {
            let [n_rows, n_cols, n_tokens] = shape;
            LinearArgs {
                w: QWeightRef {
                    ty: GgmlType::Q5_0,
                    data: w,
                    n_rows,
                    n_cols,
                },
                x,
                y,
                n_tokens,
                y_stride: n_rows,
                y_col: 0,
                bias: None,
                accumulate: false,
                norm: None,
                pending: None,
            }
        }
        let shape = [n_rows, n_cols, n_tokens];
        let (ag, au) = (
            product(&wg_s, &x_s, &g_s, shape),
            product(&wu_s, &x_s, &u_s, shape),
        );
        let n = n_tokens * n_rows;
        let base = |c: &mut Chain| {
            default.record(c, &ag).unwrap();
            default.record(c, &au).unwrap();
            c.compute_barrier().unwrap();
            glu.record(c, &g_s, &u_s, &g_s, n, GluOp::Silu).unwrap();
        };
        let outputs = n as usize;
        ctx.fill(&g_b, 0, bytes, f32::NAN.to_bits()).unwrap();
        let ns = if std::env::var_os("GLU_SKIP_BASE").is_some() {
            1.0
        } else {
            wall_ns(ctx, 20, &base)
        };
        let mut want = vec![0f32; outputs];
        ctx.download(&g_b, 0, &mut want).unwrap();
        let flop = 4.0 * f64::from(n_rows) * f64::from(n_cols) * f64::from(n_tokens);
        let mut line = format!(
            "GLU Q5_0 {n_rows}x{n_cols} x{n_tokens:<4} gate+up+glu {:.1}us {:.0}GF",
            ns / 1e3,
            flop / ns
        );
        let ga = crate::LinearGluArgs {
            gate: QWeightRef {
                ty: GgmlType::Q5_0,
                data: &wg_s,
                n_rows,
                n_cols,
            },
            up: QWeightRef {
                ty: GgmlType::Q5_0,
                data: &wu_s,
                n_rows,
                n_cols,
            },
            x: &x_s,
            y: &f_s,
            n_tokens,
            op: GluOp::Silu,
            norm: None,
            pending: None,
        };
        for (name, t) in &built {
            ctx.fill(&f_b, 0, bytes, f32::NAN.to_bits()).unwrap();
            let rec = |c: &mut Chain| {
                default
                    .dispatch_glu(c, Some(t), ti, &ga, &wg_s, &wu_s, rb)
                    .unwrap()
            };
            let ns = wall_ns(ctx, 20, &rec);
            let mut got = vec![0f32; outputs];
            ctx.download(&f_b, 0, &mut got).unwrap();
            let ok = verdict(&got, &want);
            line += &format!(" {name} {:.1}us {:.0}GF {ok}", ns / 1e3, flop / ns);
        }
        println!("{line}");
    }
}

/// Total GPU time (ns) per recording of `reps` back-to-back recordings of `rec` (every
/// dispatch of a recording summed: a split-K product and its sum), after the warm-up of
/// [`gpu_ns`].
fn gpu_total_ns(ctx: &Context, reps: usize, rec: &dyn Fn(&mut Chain)) -> f64 {
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

/// Split-K against tile shape at qwen2.5-0.5B's Q5_0 shapes (`cargo test -p octoflow-kernels --release --features bench --lib coop_split -- --ignored --nocapture --test-threads 1`): GPU time of the product
/// plus the sum of its pieces, for the 128 x 64 and 128 x 128 tiles and split-K targets of 1
/// (no split) to 528 workgroups.
#[test]
#[ignore]
fn coop_split() {
    use crate::shaders as s;
    let Some(ctx) = gpu_or_skip("coop_split") else {
        return;
    };
    if !MatmulCoop::supported(ctx.caps()) {
        return;
    }
    let mut tiles = [
        (
            "128x64",
            MatmulCoop::with_shaders(&ctx, &[s::MATMUL_COOP_Q5_0], [128, 64, 64]).unwrap(),
        ),
        (
            "128x128",
            MatmulCoop::with_shaders(&ctx, &[s::MATMUL_COOP_WIDE_Q5_0], [128, 128, 64]).unwrap(),
        ),
        (
            "64x64/4",
            MatmulCoop::with_shaders(&ctx, &[s::MATMUL_COOP_X_M64_Q5_0], [64, 64, 64]).unwrap(),
        ),
        (
            "64x64/8",
            MatmulCoop::with_shaders(&ctx, &[s::MATMUL_COOP_X_M64W8_Q5_0], [64, 64, 64]).unwrap(),
        ),
    ];
    let mut rng = StdRng::seed_from_u64(4);
    let targets: Vec<u32> = match std::env::var("COOP_SPLIT_TARGETS") {
        Ok(t) => t.split(',').filter_map(|v| v.parse().ok()).collect(),
        Err(_) => vec![1, 66, 132, 264, 528],
    };
    let shapes = [
        (896u32, 896u32),
        (128, 896),
        (4864, 896),
        (896, 4864),
        (576, 576),
        (192, 576),
        (1024, 640),
        (256, 640),
        (640, 1024),
    ];
    for (n_rows, n_cols) in shapes {
        let product = Q5Product::new(&ctx, &mut rng, n_rows, n_cols);
        let ys = product.y.whole();
        for n_tokens in [128u32, 512] {
            let args = product.args(&ys, n_tokens);
            let mut line = format!("Q5_0 {n_rows}x{n_cols} x{n_tokens}:");
            for (name, mm) in tiles.iter_mut() {
                line += &format!(" | {name}");
                for &target in &targets {
                    mm.target_groups = target;
                    let ns = gpu_total_ns(&ctx, 11, &|c| mm.record(c, &args).unwrap());
                    line += &format!(" {target}:{:.1}", ns / 1e3);
                }
            }
            println!("{line}");
        }
    }
}

/// Cooperative-matrix product throughput (`coopmat_probe.comp`; `cargo test -p
/// octoflow-kernels --release --features bench --lib coopmat_probe -- --ignored --nocapture`): TFLOP/s of 16 x 16 x 16
/// f16 -> f32 products with the fragments kept in registers or reloaded from shared memory
/// every step, 2 to 16 accumulators per subgroup, 2 and 4 workgroups of 256 per SM of an H100.
#[test]
#[ignore]
fn coopmat_probe() {
    use crate::shaders as s;
    use octoflow_vk::{Pipeline, PipelineDesc, Push};
    let Some(ctx) = gpu_or_skip("coopmat_probe") else {
        return;
    };
    if !MatmulCoop::supported(ctx.caps()) {
        println!("coopmat_probe: no cooperative matrices here");
        return;
    }
    let out = Buffer::new(&ctx, "out", 4 * 256 * 8 * 528, MemoryKind::DeviceLocal).unwrap();
    for (name, shader, mmas) in [
        ("registers 2x2", s::COOPMAT_PROBE_REG, 4u32),
        ("registers 2x4", s::COOPMAT_PROBE_REG24, 8),
        ("shared 2x2", s::COOPMAT_PROBE_SHARED, 4),
        ("shared 2x4", s::COOPMAT_PROBE_SHARED24, 8),
        ("shared 4x4", s::COOPMAT_PROBE_SHARED44, 16),
    ] {
        let mut desc = PipelineDesc::new(shader, 1, 4).subgroup_size(32);
        desc.full_subgroups = true;
        let pipe = Pipeline::new(&ctx, &desc).unwrap();
        for groups in [264u32, 528] {
            let iters = 4096u32;
            let ns = gpu_ns(&ctx, 5, &|c| {
                c.dispatch(
                    &pipe,
                    &[out.whole()],
                    &Push::new().u32(iters),
                    [groups, 1, 1],
                )
                .unwrap();
            });
            let flop = f64::from(groups) * 8.0 * f64::from(iters) * f64::from(mmas) * 8192.0;
            println!(
                "coopmat {name:<14} {groups} workgroups: {:8.1} us {:7.1} TFLOP/s",
                ns / 1e3,
                flop / ns / 1e3
            );
        }
    }
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

/// Every matvec work layout (workgroup size, invocations per row, tokens per pipeline) at the
/// decode shapes of the three models: wall time per dispatch over a long chain with a compute
/// barrier after each (as [`dispatch_overhead`]), the driver's register count where it reports
/// one, and the worst difference from the default layout's output (`cargo test -p
/// octoflow-kernels --release --features bench --lib matvec_layouts -- --ignored --nocapture --test-threads 1`; filter
/// with `LINEAR_BENCH=q5_0`).
#[test]
#[ignore]
fn matvec_layouts() {
    use crate::glu::GluOp;
    use crate::linear::{LinearGluArgs, MatvecPlan};
    use crate::qweight::{type_index, variant, QOp};
    use octoflow_vk::PipelineDesc;
    let Some(ctx) = gpu_or_skip("matvec_layouts") else {
        return;
    };
    println!("device: {}", ctx.caps().name);
    let filter = std::env::var("LINEAR_BENCH").unwrap_or_default();
    let lin = Linear::with_layout(&ctx, false, crate::Tuning::from_caps(ctx.caps())).unwrap();
    let cpu = ctx.caps().kind == octoflow_vk::DeviceKind::Cpu;
    let n = if cpu { 10 } else { 2000 };
    let per_dispatch = |n: usize, rec: &dyn Fn(&mut Chain)| -> f64 {
        let mut chain = Chain::new(&ctx).unwrap();
        for _ in 0..n {
            rec(&mut chain);
            chain.compute_barrier().unwrap();
        }
        chain.run().unwrap();
        let t = std::time::Instant::now();
        chain.run().unwrap();
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    };
    let mut rng = StdRng::seed_from_u64(5);
    use GgmlType::*;
    // (type, rows, cols, fused norm, GLU): qwen2.5-0.5B, smollm2-135M, gemma-3-270M
    let shapes = [
        (Q5_0, 896, 896, true, false),
        (Q5_0, 128, 896, true, false),
        (Q5_0, 896, 896, false, false),
        (Q5_0, 4864, 896, true, true),
        (Q4_K, 896, 4864, false, false),
        (Q6_K, 896, 4864, false, false),
        (Q8_0, 151936, 896, true, false),
        (Q4_1, 576, 576, true, false),
        (Q4_1, 1536, 576, true, true),
        (Q4_1, 576, 1536, false, false),
        (Q8_0, 49152, 576, true, false),
        (Q8_0, 640, 640, true, false),
        (Q8_0, 2048, 640, true, true),
        (Q4_K, 640, 2048, false, false),
        (Q6_K, 640, 2048, false, false),
    ];
    // LINEAR_LAYOUTS=rpt: single-token layouts of 64/128 invocations only (rows per invocation)
    let quick = std::env::var("LINEAR_LAYOUTS").is_ok_and(|v| v == "rpt");
    let mut layouts = vec![];
    for tpr in [32u32, 64, 128, 256] {
        for wg in [32u32, 64, 128, 256] {
            if wg >= tpr && (!quick || (64..=128).contains(&wg)) {
                for (maxt, rpt) in [(1u32, 1u32), (1, 2), (1, 4), (8, 1), (4, 2)] {
                    if !quick || maxt == 1 {
                        layouts.push(MatvecPlan { wg, tpr, maxt, rpt });
                    }
                }
            }
        }
    }
    // what the driver reports about one pipeline
    let desc = PipelineDesc::new(variant(QOp::Matvec, 0), 8, 40)
        .spec(&[128, 32, 8])
        .capture_statistics();
    if let Ok(stats) = octoflow_vk::Pipeline::new(&ctx, &desc).and_then(|p| p.statistics()) {
        for (k, v) in stats {
            println!("statistic {k} = {v}");
        }
    }
    for (ty, n_rows, n_cols, norm, glu) in shapes {
        let name = format!(
            "{ty} {n_rows}x{n_cols}{}{}",
            if norm { " norm" } else { "" },
            if glu { " glu" } else { "" }
        );
        if !name.to_lowercase().contains(&filter) {
            continue;
        }
        let (r, c) = (n_rows as usize, n_cols as usize);
        let wb = buffer_with(&ctx, "w", &random_weights(&mut rng, ty, r, c));
        let ub = buffer_with(&ctx, "u", &random_weights(&mut rng, ty, r, c));
        let x: Vec<f32> = (0..8 * c).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let xb = buffer_with(&ctx, "x", octoflow_vk::as_bytes(&x));
        let g: Vec<f32> = (0..c).map(|_| rng.gen_range(0.5..1.5)).collect();
        let gb = buffer_with(&ctx, "g", octoflow_vk::as_bytes(&g));
        let yb = Buffer::new(
            &ctx,
            "y",
            4 * 8 * u64::from(n_rows),
            MemoryKind::DeviceLocal,
        )
        .unwrap();
        let (ws, us, xs, gs, ys) = (wb.whole(), ub.whole(), xb.whole(), gb.whole(), yb.whole());
        let bytes = if glu { 2 * wb.size() } else { wb.size() };
        let record = |chain: &mut Chain, n_tokens: u32, plan: Option<MatvecPlan>| {
            let w = |data| QWeightRef {
                ty,
                data,
                n_rows,
                n_cols,
            };
            let normed = norm.then_some((&gs, 1e-6f32));
            if glu {
                let a = LinearGluArgs {
                    gate: w(&ws),
                    up: w(&us),
                    x: &xs,
                    y: &ys,
                    n_tokens,
                    op: GluOp::Silu,
                    norm: normed,
                    pending: None,
                };
                lin.record_glu_with(chain, &a, plan).unwrap();
            } else {
                let a = LinearArgs {
                    w: w(&ws),
                    x: &xs,
                    y: &ys,
                    n_tokens,
                    y_stride: n_rows,
                    y_col: 0,
                    bias: None,
                    accumulate: false,
                    norm: normed,
                    pending: None,
                };
                lin.record_with(chain, &a, plan).unwrap();
            }
        };
        let output = |n_tokens: u32, plan: Option<MatvecPlan>| {
            let mut chain = Chain::new(&ctx).unwrap();
            chain.fill(&ys, 0x7fc0_0000).unwrap();
            chain.barrier().unwrap();
            record(&mut chain, n_tokens, plan);
            chain.run().unwrap();
            let mut got = vec![0f32; n_tokens as usize * r];
            ctx.download(&yb, 0, &mut got).unwrap();
            got
        };
        for n_tokens in [1u32, 4] {
            let reference = output(n_tokens, Some(MatvecPlan::DEFAULT));
            let chosen = if glu {
                MatvecPlan::choose_glu(n_rows, n_cols, n_tokens)
            } else {
                MatvecPlan::choose(n_rows, n_cols, n_tokens)
            };
            let reps = if n_rows > 40_000 { n / 10 + 1 } else { n };
            let plans: Vec<MatvecPlan> = layouts
                .iter()
                .copied()
                .filter(|p| p.maxt >= n_tokens)
                .collect();
            // correctness and register counts first (pipeline builds stall the GPU)
            let mut info = vec![];
            for &plan in &plans {
                let got = output(n_tokens, Some(plan));
                let err = got
                    .iter()
                    .zip(&reference)
                    .map(|(a, b)| {
                        if a.is_nan() {
                            f32::INFINITY
                        } else {
                            (a - b).abs() / b.abs().max(1e-2)
                        }
                    })
                    .fold(0f32, f32::max);
                let op = if glu { QOp::MatvecGlu } else { QOp::Matvec };
                let (bindings, push) = if glu { (9, 44) } else { (8, 40) };
                let spec = [plan.wg, plan.tpr, plan.maxt, plan.rpt];
                let desc = PipelineDesc::new(
                    variant(op, type_index("bench", ty).unwrap()),
                    bindings,
                    push,
                )
                .spec(&spec)
                .capture_statistics();
                let regs = octoflow_vk::Pipeline::new(&ctx, &desc)
                    .and_then(|p| p.statistics())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(k, _)| k.to_lowercase().contains("register"))
                    .map(|(_, v)| v)
                    .collect::<Vec<_>>()
                    .join("/");
                info.push((err, regs));
            }
            // the GPU busy for a second, then every layout timed three times round robin
            let t0 = std::time::Instant::now();
            while t0.elapsed().as_secs_f64() < 1.0 {
                per_dispatch(reps, &|c| record(c, n_tokens, None));
            }
            let mut times = vec![f64::MAX; plans.len()];
            for _ in 0..3 {
                for (i, &plan) in plans.iter().enumerate() {
                    let t = per_dispatch(reps, &|c| record(c, n_tokens, Some(plan)));
                    times[i] = times[i].min(t);
                }
            }
            let mut best = (f64::MAX, MatvecPlan::DEFAULT);
            for (i, &plan) in plans.iter().enumerate() {
                let (t, (err, regs)) = (times[i], &info[i]);
                let mark = if plan == chosen { " <- chosen" } else { "" };
                println!(
                    "{name:<28} x{n_tokens} wg {:3} tpr {:3} maxt {} rpt {} {t:8.2} us {:6.0} GB/s regs {regs:>4} err {err:.1e}{mark}",
                    plan.wg, plan.tpr, plan.maxt, plan.rpt, bytes as f64 / t / 1e3
                );
                if t < best.0 {
                    best = (t, plan);
                }
            }
            println!("{name:<28} x{n_tokens} BEST {:?} {:.2} us", best.1, best.0);
        }
    }
}

/// Where a single-token matvec's time goes, at qwen2.5-0.5B's decode shapes (the FFN's fused
/// gate/up with its norm, 4864 x 896 Q5_0; a 896 x 896 Q5_0 projection with the norm; the
/// 896 x 4864 Q4_K down projection; gemma-3-270M's 2048 x 640 GLU with and without a pending
/// post-norm, its 1024 x 640 q projection with one): wall time per dispatch over a long chain
/// with a compute barrier after each and with none, for the kernel and ablations without
/// weight reads, without x reads and without either, and the pending-norm products in other
/// layouts (workgroup / invocations per row / rows per invocation) (`cargo test -p octoflow-kernels --release --features bench --lib matvec_anatomy -- --ignored
/// --nocapture --test-threads 1`).
#[test]
#[ignore]
fn matvec_anatomy() {
    use crate::glu::GluOp;
    use crate::linear::{LinearGluArgs, MatvecPlan};
    use crate::shaders as s;
    let Some(ctx) = gpu_or_skip("matvec_anatomy") else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(5);
    let q5 = [
        ("kernel", None),
        (
            "no W",
            Some((s::MATVEC_X_NOW_Q5_0, s::MATVEC_GLU_X_NOW_Q5_0)),
        ),
        (
            "no x",
            Some((s::MATVEC_X_NOX_Q5_0, s::MATVEC_GLU_X_NOX_Q5_0)),
        ),
        (
            "neither",
            Some((s::MATVEC_X_NONE_Q5_0, s::MATVEC_GLU_X_NONE_Q5_0)),
        ),
    ];
    let q4k = [
        ("kernel", None),
        ("no W", Some((s::MATVEC_X_NOW_Q4_K, s::MATVEC_X_NOW_Q4_K))),
        ("no x", Some((s::MATVEC_X_NOX_Q4_K, s::MATVEC_X_NOX_Q4_K))),
        (
            "neither",
            Some((s::MATVEC_X_NONE_Q4_K, s::MATVEC_X_NONE_Q4_K)),
        ),
    ];
    let cases: [(&str, GgmlType, u32, u32, bool, bool, &[_]); 6] = [
        (
            "glu 4864x896 q5_0 +norm",
            GgmlType::Q5_0,
            4864,
            896,
            true,
            false,
            &q5,
        ),
        (
            "896x896 q5_0 +norm",
            GgmlType::Q5_0,
            896,
            896,
            false,
            false,
            &q5,
        ),
        (
            "down 896x4864 q4_k",
            GgmlType::Q4_K,
            896,
            4864,
            false,
            false,
            &q4k,
        ),
        (
            "glu 2048x640 q5_0 +norm",
            GgmlType::Q5_0,
            2048,
            640,
            true,
            false,
            &q5[..1],
        ),
        (
            "glu 2048x640 q5_0 +pend",
            GgmlType::Q5_0,
            2048,
            640,
            true,
            true,
            &q5[..1],
        ),
        (
            "1024x640 q5_0 +pend",
            GgmlType::Q5_0,
            1024,
            640,
            false,
            true,
            &q5[..1],
        ),
    ];
    for (name, ty, n_rows, n_cols, glu, pend, variants) in cases {
        let (rows, cols) = (n_rows as usize, n_cols as usize);
        let gb = buffer_with(&ctx, "gate", &random_weights(&mut rng, ty, rows, cols));
        let ub = buffer_with(&ctx, "up", &random_weights(&mut rng, ty, rows, cols));
        let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let g: Vec<f32> = (0..cols).map(|_| rng.gen_range(0.5..1.5)).collect();
        let xb = buffer_with(&ctx, "x", octoflow_vk::as_bytes(&x));
        let nb = buffer_with(&ctx, "norm", octoflow_vk::as_bytes(&g));
        let yb = Buffer::new(&ctx, "y", 4 * u64::from(n_rows), MemoryKind::DeviceLocal).unwrap();
        let (gw, uw, xs, ns, ys) = (gb.whole(), ub.whole(), xb.whole(), nb.whole(), yb.whole());
        let norm = (ty != GgmlType::Q4_K).then_some((&ns, 1e-6f32));
        let pb = buffer_with(&ctx, "p", octoflow_vk::as_bytes(&x));
        let sb = Buffer::new(
            &ctx,
            "settled",
            4 * u64::from(n_cols),
            MemoryKind::DeviceLocal,
        )
        .unwrap();
        let (ps, ss) = (pb.whole(), sb.whole());
        let pending = pend.then_some(crate::PendingNorm {
            p: &ps,
            weight: &ns,
            settle: (!glu).then_some(&ss),
        });
        let w = |data| QWeightRef {
            ty,
            data,
            n_rows,
            n_cols,
        };
        let mut reference: Option<Vec<f32>> = None;
        // the variants in the chosen layout; with a pending norm, the kernel in other layouts too
        let mut runs: Vec<(String, Option<_>, Option<MatvecPlan>)> = variants
            .iter()
            .map(|&(vname, shaders)| (vname.to_string(), shaders, None))
            .collect();
        if pend {
            for (wg, tpr, rpt) in [
                (64, 32, 1),
                (32, 32, 2),
                (64, 32, 2),
                (128, 32, 2),
                (32, 32, 4),
                (128, 64, 1),
                (128, 64, 2),
            ] {
                let plan = MatvecPlan {
                    wg,
                    tpr,
                    maxt: 1,
                    rpt,
                };
                runs.push((format!("{wg}/{tpr}/{rpt}"), None, Some(plan)));
            }
        }
        for (vname, shaders, plan) in runs {
            let lin = match shaders {
                None => Linear::new(&ctx).unwrap(),
                Some((mv, gl)) => Linear::new(&ctx).unwrap().with_matvec_variants(ty, mv, gl),
            };
            let rec = |c: &mut Chain| {
                if glu {
                    let args = LinearGluArgs {
                        gate: w(&gw),
                        up: w(&uw),
                        x: &xs,
                        y: &ys,
                        n_tokens: 1,
                        op: GluOp::Silu,
                        norm,
                        pending,
                    };
                    lin.record_glu_with(c, &args, plan).unwrap();
                } else {
                    let args = LinearArgs {
                        w: w(&gw),
                        x: &xs,
                        y: &ys,
                        n_tokens: 1,
                        y_stride: n_rows,
                        y_col: 0,
                        bias: None,
                        accumulate: false,
                        norm,
                        pending,
                    };
                    lin.record_with(c, &args, plan).unwrap();
                }
            };
            let per = |barrier: bool| {
                let time = |n: usize| {
                    let mut chain = Chain::new(&ctx).unwrap();
                    for _ in 0..n {
                        rec(&mut chain);
                        if barrier {
                            chain.compute_barrier().unwrap();
                        }
                    }
                    chain.run().unwrap();
                    (0..5)
                        .map(|_| {
                            let t = std::time::Instant::now();
                            chain.run().unwrap();
                            t.elapsed().as_secs_f64() * 1e6 / n as f64
                        })
                        .fold(f64::INFINITY, f64::min)
                };
                // ~1 s of warm-up at full clocks first
                let t0 = std::time::Instant::now();
                while t0.elapsed().as_secs_f64() < 1.0 {
                    time(500);
                }
                time(2000)
            };
            let (b, nb) = (per(true), per(false));
            let mut chain = Chain::new(&ctx).unwrap();
            rec(&mut chain);
            chain.run().unwrap();
            let y = crate::testkit::read(&ctx, &yb, rows);
            let check = match &reference {
                None => String::new(),
                Some(want) => verdict(&y, want),
            };
            if shaders.is_none() && plan.is_none() {
                reference = Some(y);
            }
            println!("{name:<26} {vname:<9} barrier {b:7.2} us, none {nb:7.2} us {check}");
        }
    }
}
