//! Tests of [`Linear`]'s fused paths: the post-norm pending on the input, layouts that do not
//! fit, the gate/up/activation dispatch, and the clear errors of misuse.

use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
use octoflow_vk::{Buffer, MemoryKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::tests::REL;
use super::*;
use crate::check_close;
use crate::glu::GluOp;
use crate::testkit::{buffer_with, random_cols, random_weights};

/// A post-norm pending on the input (`x + rms_norm(p) * gp`, then the fused norm): the
/// matvec and the fused GLU in every one-token layout (and the chosen ones) against the
/// references of the settled input, over random types and shapes; the settled stream
/// written by one dispatch checked against its addends; the plain fused norm in the same
/// layouts. Outputs poisoned with NaN.
#[test]
fn gpu_pending_post_norm_matches_the_reference() {
    use crate::testkit::{poisoned, read, with};
    let Some(ctx) = gpu_or_skip("matvec_pending_norm") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let lin = Linear::with_layout(&ctx, false, super::tests::f32_tuning(&ctx)).unwrap();
    let mut plans = super::tests::one_token_layouts(2, false);
    // a random few per run (pipelines compile slowly on lavapipe), the chosen ones always
    use rand::seq::SliceRandom;
    plans.shuffle(&mut rng);
    plans.truncate(4);
    for (rows, cols) in [(1024, 640), (2048, 640), (640, 2048), (4864, 896)] {
        for chosen in [
            MatvecPlan::choose(rows, cols, 1),
            MatvecPlan::choose_glu(rows, cols, 1),
        ] {
            if !plans.contains(&chosen) {
                plans.push(chosen);
            }
        }
    }
    let eps = 1e-6f32;
    for plan in plans {
        let ty = TYPES[rng.gen_range(0..TYPES.len())];
        let n_rows = rng.gen_range(37..300usize);
        let n_cols = 32 * rng.gen_range(3..40usize) * ty.block_size().div_ceil(32);
        let what = format!("{plan:?} {ty} {n_rows}x{n_cols}, seed {seed}");
        let wq = random_weights(&mut rng, ty, n_rows, n_cols);
        let uq = random_weights(&mut rng, ty, n_rows, n_cols);
        let (wb, ub) = (buffer_with(&ctx, "w", &wq), buffer_with(&ctx, "u", &uq));
        let mut vec = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
            (0..n).map(|_| rng.gen_range(lo..hi)).collect()
        };
        // a residual stream, a block's output on another scale, and the two norms' weights
        let (x, p) = (vec(n_cols, -1.0, 1.0), vec(n_cols, -8.0, 8.0));
        let (g, gp) = (vec(n_cols, 0.5, 1.5), vec(n_cols, -2.0, 2.0));
        let (xb, pb, gb, gpb) = (
            with(&ctx, "x", &x),
            with(&ctx, "p", &p),
            with(&ctx, "g", &g),
            with(&ctx, "gp", &gp),
        );
        let mut post = vec![0f32; n_cols];
        crate::rms_norm_ref(&p, &gp, &mut post, n_cols, eps);
        let settled: Vec<f32> = x.iter().zip(&post).map(|(a, b)| a + b).collect();
        let mut normed = vec![0f32; n_cols];
        crate::rms_norm_ref(&settled, &g, &mut normed, n_cols, eps);
        let w = |data| QWeightRef {
            ty,
            data,
            n_rows: n_rows as u32,
            n_cols: n_cols as u32,
        };
        let (ws, us, gs, ps, gps) = (wb.whole(), ub.whole(), gb.whole(), pb.whole(), gpb.whole());
        // the single-token product of `input` (as the kernel sees it) with the fused norm
        // and, where given, a pending post-norm, against the reference
        let product = |pending: Option<PendingNorm>, input: &[f32], case: &str| {
            let yb = poisoned(&ctx, "y", n_rows);
            let args = LinearArgs {
                w: w(&ws),
                x: &xb.whole(),
                y: &yb.whole(),
                n_tokens: 1,
                y_stride: n_rows as u32,
                y_col: 0,
                bias: None,
                accumulate: false,
                norm: Some((&gs, eps)),
                pending,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            lin.record_with(&mut chain, &args, Some(plan)).unwrap();
            chain.run().unwrap();
            let mut want = vec![0f32; n_rows];
            linear_ref(
                ty, &wq, n_rows, n_cols, input, 1, &mut want, n_rows, 0, None, false,
            )
            .unwrap();
            if let Err(e) = check_close(&read(&ctx, &yb, n_rows), &want, REL) {
                panic!("{what} ({case}): {e}");
            }
        };
        // the plain fused norm in the same layout
        let mut plain = vec![0f32; n_cols];
        crate::rms_norm_ref(&x, &g, &mut plain, n_cols, eps);
        product(None, &plain, "fused norm");
        let sb = poisoned(&ctx, "settled", n_cols);
        let ss = sb.whole();
        let pending = |settle| {
            Some(PendingNorm {
                p: &ps,
                weight: &gps,
                settle,
            })
        };
        product(pending(Some(&ss)), &normed, "pending post-norm");
        if let Err(e) = crate::check_close_sum(&read(&ctx, &sb, n_cols), &x, &post, 1e-5) {
            panic!("{what} (settled stream): {e}");
        }
        // the fused GLU, not settling
        let yb = poisoned(&ctx, "y", n_rows);
        let args = LinearGluArgs {
            gate: w(&ws),
            up: w(&us),
            x: &xb.whole(),
            y: &yb.whole(),
            n_tokens: 1,
            op: GluOp::GeluTanh,
            norm: Some((&gs, eps)),
            pending: pending(None),
        };
        let mut chain = Chain::new(&ctx).unwrap();
        lin.record_glu_with(&mut chain, &args, Some(plan), false)
            .unwrap();
        chain.run().unwrap();
        let mut want = vec![0f32; n_rows];
        let op = GluOp::GeluTanh;
        linear_glu_ref(ty, &wq, &uq, n_rows, n_cols, &normed, 1, &mut want, op).unwrap();
        if let Err(e) = check_close(&read(&ctx, &yb, n_rows), &want, REL) {
            panic!("{what} (GLU, pending post-norm): {e}");
        }
    }
    assert_no_validation_errors(&ctx);
}

/// A pending post-norm without the fused norm, on more than one token, or settling onto what
/// the dispatch reads, is a clear error.
#[test]
fn pending_post_norm_misuse_is_a_clear_error() {
    use crate::testkit::{poisoned, with};
    let Some(ctx) = gpu_or_skip("matvec_pending_misuse") else {
        return;
    };
    let lin = Linear::with_layout(&ctx, false, super::tests::f32_tuning(&ctx)).unwrap();
    let (n_rows, n_cols) = (64usize, 128usize);
    let mut rng = StdRng::seed_from_u64(7);
    let wq = random_weights(&mut rng, GgmlType::Q8_0, n_rows, n_cols);
    let wb = buffer_with(&ctx, "w", &wq);
    let ones = vec![1f32; 2 * n_cols];
    let (xb, pb, gb) = (
        with(&ctx, "x", &ones),
        with(&ctx, "p", &ones),
        with(&ctx, "g", &ones),
    );
    let yb = poisoned(&ctx, "y", 2 * n_rows);
    let (ws, xs, ps, gs, ys) = (wb.whole(), xb.whole(), pb.whole(), gb.whole(), yb.whole());
    let run = |n_tokens: u32, norm: bool, settle: Option<&BufferSlice>| {
        let args = LinearArgs {
            w: QWeightRef {
                ty: GgmlType::Q8_0,
                data: &ws,
                n_rows: n_rows as u32,
                n_cols: n_cols as u32,
            },
            x: &xs,
            y: &ys,
            n_tokens,
            y_stride: n_rows as u32,
            y_col: 0,
            bias: None,
            accumulate: false,
            norm: norm.then_some((&gs, 1e-6)),
            pending: Some(PendingNorm {
                p: &ps,
                weight: &gs,
                settle,
            }),
        };
        let mut chain = Chain::new(&ctx).unwrap();
        lin.record(&mut chain, &args).map_err(|e| e.to_string())
    };
    assert!(run(1, true, None).is_ok());
    let e = run(1, false, None).unwrap_err();
    assert!(e.contains("needs the fused norm"), "{e}");
    let e = run(2, true, None).unwrap_err();
    assert!(e.contains("one token"), "{e}");
    let e = run(1, true, Some(&xs)).unwrap_err();
    assert!(e.contains("must not overlap"), "{e}");
}

/// A layout that does not fit the tokens or the device is a clear error, not a wrong result.
#[test]
fn gpu_matvec_bad_layouts_are_errors() {
    let Some(ctx) = gpu_or_skip("matvec_bad_layouts") else {
        return;
    };
    let lin = Linear::with_layout(&ctx, false, super::tests::f32_tuning(&ctx)).unwrap();
    let wb = buffer_with(&ctx, "w", &vec![0u8; 4 * 64 * 64]);
    let xb = buffer_with(&ctx, "x", &[0u8; 4 * 64 * 4]);
    let yb = buffer_with(&ctx, "y", &[0u8; 4 * 64 * 4]);
    let args = LinearArgs {
        w: QWeightRef {
            ty: GgmlType::F32,
            data: &wb.whole(),
            n_rows: 64,
            n_cols: 64,
        },
        x: &xb.whole(),
        y: &yb.whole(),
        n_tokens: 4,
        y_stride: 64,
        y_col: 0,
        bias: None,
        accumulate: false,
        norm: None,
        pending: None,
    };
    let base = MatvecPlan::DEFAULT;
    for plan in [
        MatvecPlan { maxt: 2, ..base },
        MatvecPlan { tpr: 48, ..base },
        MatvecPlan {
            wg: 96,
            tpr: 64,
            ..base
        },
        MatvecPlan { rpt: 0, ..base },
        MatvecPlan {
            wg: 1 << 20,
            ..base
        },
        // the block layout: one token only, and not of this matrix's type
        MatvecPlan {
            blocks: true,
            ..base
        },
        MatvecPlan {
            maxt: 1,
            blocks: true,
            ..base
        },
    ] {
        let mut chain = Chain::new(&ctx).unwrap();
        let err = lin.record_with(&mut chain, &args, Some(plan));
        assert!(
            matches!(err, Err(KernelError::Shape { .. })),
            "{plan:?}: {:?}",
            err.err()
        );
    }
}

/// The worst `check_close` error of `got` against `want` (the measure its bound applies to).
fn worst_rel(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (g - w).abs() / w.abs().max(0.01 * scale).max(f32::MIN_POSITIVE))
        .fold(0f32, f32::max)
}

/// The fused GLU of `ty` through both layouts: 1, 3 and 8 tokens, both activations, with
/// and without a fused norm (GPU layout: the CPU-driver one has none).
fn check_glu_type(ty: GgmlType) {
    for cpu in [false, true] {
        check_glu_layout(ty, cpu);
    }
}

/// Random gate and up matrices of `ty` and random inputs through the GPU (`cpu` false) or
/// CPU-driver kernels, against [`linear_glu_ref`]; y poisoned with NaN, past its end too.
/// The activation is applied to a product of ~1e-6 relative error and multiplies another:
/// the linear bound [`REL`] holds (SiLU/GELU have derivatives of at most ~1.1 in magnitude).
fn check_glu_layout(ty: GgmlType, cpu: bool) {
    use crate::testkit::{poisoned, read, with};
    let Some(ctx) = gpu_or_skip(&format!("linear_glu_{ty}")) else {
        return;
    };
    if cpu && !cpu_layout_runs(&ctx) {
        println!("linear_glu_{ty}: CPU-driver layout skipped (no 8-wide subgroups)");
        return;
    }
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let lin = Linear::with_layout(&ctx, cpu, super::tests::f32_tuning(&ctx)).unwrap();
    let n_rows = rng.gen_range(96..300usize);
    let n_cols = random_cols(&mut rng, ty);
    let gq = random_weights(&mut rng, ty, n_rows, n_cols);
    let uq = random_weights(&mut rng, ty, n_rows, n_cols);
    let (gb, ub) = (buffer_with(&ctx, "gate", &gq), buffer_with(&ctx, "up", &uq));
    let nw: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(0.5..1.5)).collect();
    let nb = with(&ctx, "norm", &nw);
    let eps = 1e-6f32;
    let mut worst = 0f32;
    for n_tokens in [1usize, 3, 8] {
        assert!(lin.fuses_glu(n_tokens as u32, ty, ty));
        let x: Vec<f32> = (0..n_tokens * n_cols)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let xb = with(&ctx, "x", &x);
        let len = n_tokens * n_rows;
        // where batches of this size go to the cooperative-matrix kernel (its own tests),
        // the matvec kernel is asked for by its layout
        let plan = lin
            .uses_coop(n_tokens as u32)
            .then(|| MatvecPlan::choose_glu(n_rows as u32, n_cols as u32, n_tokens as u32));
        for op in [GluOp::Silu, GluOp::GeluTanh] {
            for fused in [false, true] {
                if fused && !lin.fuses_norm(n_tokens as u32) && plan.is_none() {
                    continue;
                }
                // 5 floats past y's end must stay NaN
                let yb = poisoned(&ctx, "y", len + 5);
                let ns = nb.whole();
                let args = LinearGluArgs {
                    gate: QWeightRef {
                        ty,
                        data: &gb.whole(),
                        n_rows: n_rows as u32,
                        n_cols: n_cols as u32,
                    },
                    up: QWeightRef {
                        ty,
                        data: &ub.whole(),
                        n_rows: n_rows as u32,
                        n_cols: n_cols as u32,
                    },
                    x: &xb.whole(),
                    y: &yb.slice(0, 4 * len as u64).unwrap(),
                    n_tokens: n_tokens as u32,
                    op,
                    norm: fused.then_some((&ns, eps)),
                    pending: None,
                };
                let mut chain = Chain::new(&ctx).unwrap();
                lin.record_glu_with(&mut chain, &args, plan, false).unwrap();
                chain.run().unwrap();
                let got = read(&ctx, &yb, len + 5);
                let x_in = if fused {
                    let mut h = vec![0f32; x.len()];
                    crate::rms_norm_ref(&x, &nw, &mut h, n_cols, eps);
                    h
                } else {
                    x.clone()
                };
                let mut want = vec![0f32; len];
                linear_glu_ref(ty, &gq, &uq, n_rows, n_cols, &x_in, n_tokens, &mut want, op)
                    .unwrap();
                let what = format!(
                    "fused GLU {ty} {op:?} (cpu layout {cpu}, fused norm {fused}) \
                    {n_rows}x{n_cols}, {n_tokens} tokens, seed {seed}"
                );
                if let Err(e) = check_close(&got[..len], &want, REL) {
                    panic!("{what}: {e}");
                }
                assert!(
                    got[len..].iter().all(|v| v.is_nan()),
                    "{what}: written past y's end"
                );
                worst = worst.max(worst_rel(&got[..len], &want));
            }
        }
    }
    println!(
        "linear_glu_{ty} (cpu layout {cpu}) {n_rows}x{n_cols}: worst relative error {worst:.2e}"
    );
    assert_no_validation_errors(&ctx);
}

macro_rules! glu_type_tests {
    ($($name:ident => $ty:ident),*) => {$(
        #[test]
        fn $name() {
            check_glu_type(GgmlType::$ty);
        }
    )*};
}

glu_type_tests!(
    gpu_linear_glu_f32 => F32, gpu_linear_glu_f16 => F16, gpu_linear_glu_q4_0 => Q4_0,
    gpu_linear_glu_q4_1 => Q4_1, gpu_linear_glu_q5_0 => Q5_0, gpu_linear_glu_q5_1 => Q5_1,
    gpu_linear_glu_q8_0 => Q8_0, gpu_linear_glu_q4_k => Q4_K, gpu_linear_glu_q5_k => Q5_K,
    gpu_linear_glu_q6_k => Q6_K, gpu_linear_glu_bf16 => BF16, gpu_linear_glu_mxfp4 => MXFP4,
    gpu_linear_glu_iq4_nl => IQ4_NL, gpu_linear_glu_q2_k => Q2_K, gpu_linear_glu_q3_k => Q3_K,
    gpu_linear_glu_iq4_xs => IQ4_XS
);

#[test]
fn fused_glu_mismatches_are_clear_errors() {
    let Some(ctx) = gpu_or_skip("linear_glu_mismatches") else {
        return;
    };
    let big = Buffer::new(&ctx, "big", 1 << 20, MemoryKind::DeviceLocal).unwrap();
    let small = Buffer::new(&ctx, "small", 64, MemoryKind::DeviceLocal).unwrap();
    let (bw, sw) = (big.whole(), small.whole());
    let w = |ty, n_rows, data| QWeightRef {
        ty,
        data,
        n_rows,
        n_cols: 64,
    };
    let layouts = if cpu_layout_runs(&ctx) {
        vec![false, true]
    } else {
        vec![false]
    };
    for cpu in layouts {
        let lin = Linear::with_layout(&ctx, cpu, super::tests::f32_tuning(&ctx)).unwrap();
        let run = |gate, up, n_tokens, norm| {
            let a = LinearGluArgs {
                gate,
                up,
                x: &bw,
                y: &bw,
                n_tokens,
                op: GluOp::Silu,
                norm,
                pending: None,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            lin.record_glu(&mut chain, &a).unwrap_err().to_string()
        };
        let q8 = GgmlType::Q8_0;
        let e = run(w(q8, 8, &bw), w(q8, 16, &bw), 1, None);
        assert!(e.contains("gate is 8x64 and up 16x64"), "{e}");
        let e = run(w(q8, 8, &bw), w(GgmlType::Q4_0, 8, &bw), 1, None);
        assert!(e.contains("gate is Q8_0 and up Q4_0"), "{e}");
        if lin.uses_coop(9) {
            // batches on cooperative matrices fuse too, but without a norm
            let e = run(w(q8, 8, &bw), w(q8, 8, &bw), 9, Some((&bw, 1e-6)));
            assert!(e.contains("fused norm needs the matvec kernel"), "{e}");
        } else {
            let e = run(w(q8, 8, &bw), w(q8, 8, &bw), 9, None);
            assert!(e.contains("9 tokens") && e.contains("1..=8"), "{e}");
        }
        let e = run(w(q8, 8, &bw), w(q8, 8, &sw), 2, None);
        assert!(e.contains("up weights (small)"), "{e}");
        let e = run(
            w(GgmlType::Q8_K, 8, &bw),
            w(GgmlType::Q8_K, 8, &bw),
            2,
            None,
        );
        assert!(e.contains("Q8_K") && e.contains("not supported"), "{e}");
        if cpu {
            let e = run(w(q8, 8, &bw), w(q8, 8, &bw), 2, Some((&bw, 1e-6)));
            assert!(e.contains("fused norm"), "{e}");
        } else {
            let e = run(w(q8, 8, &bw), w(q8, 8, &bw), 2, Some((&sw, 1e-6)));
            assert!(e.contains("norm (small)"), "{e}");
        }
        assert!(lin.fuses_glu(8, q8, q8) && lin.fuses_glu(1, q8, q8));
        assert_eq!(lin.fuses_glu(9, q8, q8), lin.uses_coop(9));
        assert!(!lin.fuses_glu(0, q8, q8));
        assert!(!lin.fuses_glu(1, q8, GgmlType::Q4_0));
        assert!(!lin.fuses_glu(1, GgmlType::Q8_K, GgmlType::Q8_K));
    }
}

#[test]
fn bad_shapes_and_types_are_clear_errors() {
    let Some(ctx) = gpu_or_skip("linear_bad_shapes") else {
        return;
    };
    let lin = Linear::new(&ctx).unwrap();
    let big = Buffer::new(&ctx, "big", 1 << 20, MemoryKind::DeviceLocal).unwrap();
    let small = Buffer::new(&ctx, "small", 64, MemoryKind::DeviceLocal).unwrap();
    let (bw, sw) = (big.whole(), small.whole());
    let args = |ty, n_cols, x: &'static str| {
        let xs = if x == "small" { &sw } else { &bw };
        let a = LinearArgs {
            w: QWeightRef {
                ty,
                data: &bw,
                n_rows: 8,
                n_cols,
            },
            x: xs,
            y: &bw,
            n_tokens: 3,
            y_stride: 8,
            y_col: 0,
            bias: None,
            accumulate: false,
            norm: None,
            pending: None,
        };
        let mut chain = Chain::new(&ctx).unwrap();
        lin.record(&mut chain, &a)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    let e = args(GgmlType::Q4_K, 300, "big");
    assert!(e.contains("300") && e.contains("256"), "{e}");
    let e = args(GgmlType::Q8_K, 256, "big");
    assert!(e.contains("Q8_K") && e.contains("not supported"), "{e}");
    let e = args(GgmlType::Q8_0, 64, "small");
    assert!(e.contains("x (small)") && e.contains("192 floats"), "{e}");
    assert!(!Linear::supports(GgmlType::Q8_K) && Linear::supports(GgmlType::Q6_K));
    let a = LinearArgs {
        w: QWeightRef {
            ty: GgmlType::F32,
            data: &bw,
            n_rows: 8,
            n_cols: 4,
        },
        x: &bw,
        y: &bw,
        n_tokens: 2,
        y_stride: 9,
        y_col: 2,
        bias: Some(&sw),
        accumulate: false,
        norm: None,
        pending: None,
    };
    let mut chain = Chain::new(&ctx).unwrap();
    let e = lin.record(&mut chain, &a).unwrap_err().to_string();
    assert!(e.contains("y_stride 9 < y_col 2 + n_rows 8"), "{e}");
}
