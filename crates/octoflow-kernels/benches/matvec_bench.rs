//! The matvec (decode) benchmarks: every work layout at the decode shapes, and the anatomy of
//! one dispatch. A child of linear_bench.rs (same feature, same command), sharing its timing
//! helpers.

use octoflow_gguf::GgmlType;
use octoflow_vk::testing::gpu_or_skip;
use octoflow_vk::{Buffer, Chain, MemoryKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::verdict;
use crate::linear::{Linear, LinearArgs, QWeightRef};
use crate::testkit::{buffer_with, random_weights};

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
    use crate::qweight::{type_index, QOp};
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
    // LINEAR_SHAPES=8b: Llama-3.1-8B's decode shapes as llama.cpp's Q4_K_M types them instead
    let big = [
        (Q4_K, 4096, 4096, true, false),
        (Q4_K, 1024, 4096, true, false),
        (Q4_K, 4096, 4096, false, false),
        (Q4_K, 14336, 4096, true, true),
        (Q4_K, 4096, 14336, false, false),
        (Q6_K, 4096, 14336, false, false),
        (Q6_K, 128256, 4096, true, false),
    ];
    let shapes = if std::env::var("LINEAR_SHAPES").is_ok_and(|v| v == "8b") {
        &big[..]
    } else {
        &shapes[..]
    };
    // LINEAR_LAYOUTS=rpt: single-token layouts of 64/128 invocations only (rows per invocation)
    let quick = std::env::var("LINEAR_LAYOUTS").is_ok_and(|v| v == "rpt");
    let mut layouts = vec![];
    for tpr in [32u32, 64, 128, 256] {
        for wg in [32u32, 64, 128, 256] {
            if wg >= tpr && (!quick || (64..=128).contains(&wg)) {
                for (maxt, rpt) in [(1u32, 1u32), (1, 2), (1, 4), (8, 1), (4, 2)] {
                    if !quick || maxt == 1 {
                        layouts.push(MatvecPlan {
                            wg,
                            tpr,
                            maxt,
                            rpt,
                            blocks: false,
                        });
                        if maxt == 1 && tpr <= 128 {
                            layouts.push(MatvecPlan {
                                wg,
                                tpr,
                                maxt,
                                rpt,
                                blocks: true,
                            });
                        }
                    }
                }
            }
        }
    }
    // what the driver reports about one pipeline
    let desc = PipelineDesc::new(QOp::Matvec.variant(0), 8, 40)
        .spec(&[128, 32, 8])
        .capture_statistics();
    if let Ok(stats) = octoflow_vk::Pipeline::new(&ctx, &desc).and_then(|p| p.statistics()) {
        for (k, v) in stats {
            println!("statistic {k} = {v}");
        }
    }
    for &(ty, n_rows, n_cols, norm, glu) in shapes {
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
                lin.record_glu_with(chain, &a, plan, false).unwrap();
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
            let blocks = (!glu && MatvecPlan::blocks_fit(ty, n_cols, n_tokens, &[&ws]))
                .then(|| MatvecPlan::blocks(n_rows, n_cols, norm))
                .flatten();
            let chosen = match blocks {
                Some(p) => p,
                None if glu => MatvecPlan::choose_glu(n_rows, n_cols, n_tokens),
                None => MatvecPlan::choose(n_rows, n_cols, n_tokens),
            };
            let reps = if n_rows > 40_000 { n / 10 + 1 } else { n };
            let plans: Vec<MatvecPlan> = layouts
                .iter()
                .copied()
                .filter(|p| p.maxt >= n_tokens)
                .filter(|p| !p.blocks || MatvecPlan::blocks_fit(ty, n_cols, n_tokens, &[&ws]))
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
                let spec = [
                    plan.wg,
                    plan.tpr,
                    plan.maxt,
                    plan.rpt,
                    0,
                    u32::from(plan.blocks),
                ];
                let desc =
                    PipelineDesc::new(op.variant(type_index("bench", ty).unwrap()), bindings, push)
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
                    "{name:<28} x{n_tokens} wg {:3} tpr {:3} maxt {} rpt {}{} {t:8.2} us {:6.0} GB/s regs {regs:>4} err {err:.1e}{mark}",
                    plan.wg, plan.tpr, plan.maxt, plan.rpt, if plan.blocks { " blocks" } else { "" },
                    bytes as f64 / t / 1e3
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
                    blocks: false,
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
                    lin.record_glu_with(c, &args, plan, false).unwrap();
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
