//! The cooperative-matrix (prefill) benchmarks: tile sizes, f16 operands, the fused GLU, the
//! split of a product across workgroups and the driver's cooperative-matrix shapes. A child of
//! linear_bench.rs (same feature, same command), sharing its timing helpers.

use octoflow_gguf::GgmlType;
use octoflow_vk::testing::gpu_or_skip;
use octoflow_vk::{Buffer, BufferSlice, Chain, Context, MemoryKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{gpu_ns, gpu_total_ns, print_statistics, verdict, wall_ns};
use crate::linear::{Linear, LinearArgs, QWeightRef};
use crate::matmul_coop::MatmulCoop;
use crate::testkit::{buffer_with, random_weights};
use crate::GluOp;

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
