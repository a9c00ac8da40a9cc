//! Random-input tests of [`Linear`]'s products on every weight type, through both layouts
//! and every matvec work layout, against [`linear_ref`].

use octoflow_gguf::quant::QuantError;
use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
use rand::Rng;

use super::*;
use crate::check_close;
use crate::glu::GluOp;
use crate::testkit::{buffer_with, random_cols, random_weights};

/// The shader decodes weights exactly as the CPU codec (up to a fused multiply-add in
/// `d*q + m`) and sums up to ~1000 f32 products in another order than the f64 reference:
/// typical errors are ~sqrt(n)·2⁻²⁴ ≈ 1e-6 of the output scale, and `check_close` divides by
/// at least 1% of that scale, so an output near that floor reads ~1e-4 (CI saw 1.04e-4 on a
/// Q5_1 928-column row with the CPU-driver layout). 5e-4 leaves margin, while a single
/// misdecoded weight or a wrong scale moves an output by >= 1e-2 of the scale (relative >= 1
/// at the floor).
pub(super) const REL: f32 = 5e-4;

/// The device's tuning with the products of f32 x ([`Tuning::matvec_dot`] and
/// [`Tuning::dot_batches`] off): what the matvec tests hold to the f32 references (the 8-bit
/// path has its own, `matvec_dot_tests.rs`).
pub(super) fn f32_tuning(ctx: &Context) -> Tuning {
    Tuning {
        matvec_dot: false,
        dot_batches: crate::tuning::DotBatches::Off,
        ..Tuning::from_caps(ctx.caps())
    }
}

/// The signature shared by [`linear_ref`] and [`crate::matmul_coop_ref`].
pub(super) type RefFn = fn(
    GgmlType,
    &[u8],
    usize,
    usize,
    &[f32],
    usize,
    &mut [f32],
    usize,
    usize,
    Option<&[f32]>,
    bool,
) -> Result<(), QuantError>;

fn check_type(ty: GgmlType) {
    for cpu in [false, true] {
        check_layout(ty, cpu);
    }
}

/// Random shapes and options of `ty` through the GPU (`cpu` false) or CPU-driver kernels.
fn check_layout(ty: GgmlType, cpu: bool) {
    let Some(ctx) = gpu_or_skip(&format!("linear_{ty}")) else {
        return;
    };
    if cpu && !cpu_layout_runs(&ctx) {
        // The H100's subgroups are 32 wide and cannot be made 8: that layout never runs there.
        println!("linear_{ty}: CPU-driver layout skipped (no 8-wide subgroups)");
        return;
    }
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let lin = Linear::with_layout(&ctx, cpu, f32_tuning(&ctx)).unwrap();
    let n_rows = rng.gen_range(96..300usize);
    let n_cols = random_cols(&mut rng, ty);
    let wq = random_weights(&mut rng, ty, n_rows, n_cols);
    let wb = buffer_with(&ctx, "w", &wq);
    let bias: Vec<f32> = (0..n_rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let bb = buffer_with(&ctx, "bias", octoflow_vk::as_bytes(&bias));
    for (case, n_tokens) in [1usize, 2, 4, 7, 33, 70].into_iter().enumerate() {
        let with_bias = case % 2 == 0;
        let accumulate = case % 3 == 1;
        let y_col = if case % 2 == 1 {
            rng.gen_range(1..9)
        } else {
            0
        };
        let y_stride = y_col + n_rows + rng.gen_range(0..5);
        let x: Vec<f32> = (0..n_tokens * n_cols)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let xb = buffer_with(&ctx, "x", octoflow_vk::as_bytes(&x));
        let y_len = n_tokens * y_stride;
        let y0: Vec<f32> = if accumulate {
            (0..y_len).map(|_| rng.gen_range(-1.0..1.0)).collect()
        } else {
            vec![f32::NAN; y_len]
        };
        let yb = buffer_with(&ctx, "y", octoflow_vk::as_bytes(&y0));
        let bias_slice = with_bias.then(|| bb.whole());
        // RMSNorm fused on the input where the kernel takes it (1, 2 and 7 tokens)
        let fused = lin.fuses_norm(n_tokens as u32) && case != 2;
        let g: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(0.5..1.5)).collect();
        let gb = buffer_with(&ctx, "norm", octoflow_vk::as_bytes(&g));
        let gs = gb.whole();
        let eps = 1e-6f32;
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
            y_stride: y_stride as u32,
            y_col: y_col as u32,
            bias: bias_slice.as_ref(),
            accumulate,
            norm: fused.then_some((&gs, eps)),
            pending: None,
        };
        let mut chain = Chain::new(&ctx).unwrap();
        lin.record(&mut chain, &args).unwrap();
        chain.run().unwrap();
        let mut got = vec![0f32; y_len];
        ctx.download(&yb, 0, &mut got).unwrap();
        let mut want = y0.clone();
        // The coopmat path multiplies f16-rounded operands: its own reference and bound.
        let coop = lin.uses_coop(n_tokens as u32);
        let (reference, rel) = if coop {
            (
                crate::matmul_coop_ref as RefFn,
                crate::matmul_coop::tests::REL_COOP,
            )
        } else {
            (linear_ref as RefFn, REL)
        };
        let x_in = if fused {
            let mut h = vec![0f32; x.len()];
            crate::rms_norm_ref(&x, &g, &mut h, n_cols, eps);
            h
        } else {
            x.clone()
        };
        reference(
            ty,
            &wq,
            n_rows,
            n_cols,
            &x_in,
            n_tokens,
            &mut want,
            y_stride,
            y_col,
            with_bias.then_some(&bias[..]),
            accumulate,
        )
        .unwrap();
        let what = format!(
            "{ty} (cpu layout {cpu}, coopmat {coop}, fused norm {fused}) {n_rows}x{n_cols}, {n_tokens} tokens, \
            bias {with_bias}, accumulate {accumulate}, y_col {y_col}, y_stride {y_stride}, seed {seed}"
        );
        for t in 0..n_tokens {
            let row = t * y_stride;
            let (g, wv) = (&got[row..row + y_stride], &want[row..row + y_stride]);
            let inside = y_col..y_col + n_rows;
            if let Err(e) = check_close(&g[inside.clone()], &wv[inside.clone()], rel) {
                panic!("{what}: token {t}: {e}");
            }
            for c in (0..y_stride).filter(|c| !inside.contains(c)) {
                assert_eq!(
                    g[c].to_bits(),
                    y0[row + c].to_bits(),
                    "{what}: column {c} of token {t} was written"
                );
            }
        }
    }
    assert_no_validation_errors(&ctx);
}

macro_rules! type_tests {
    ($($name:ident => $ty:ident),*) => {$(
        #[test]
        fn $name() {
            check_type(GgmlType::$ty);
        }
    )*};
}

type_tests!(
    gpu_linear_f32 => F32, gpu_linear_f16 => F16, gpu_linear_q4_0 => Q4_0,
    gpu_linear_q4_1 => Q4_1, gpu_linear_q5_0 => Q5_0, gpu_linear_q5_1 => Q5_1,
    gpu_linear_q8_0 => Q8_0, gpu_linear_q4_k => Q4_K, gpu_linear_q5_k => Q5_K,
    gpu_linear_q6_k => Q6_K, gpu_linear_bf16 => BF16, gpu_linear_mxfp4 => MXFP4,
    gpu_linear_iq4_nl => IQ4_NL, gpu_linear_q2_k => Q2_K, gpu_linear_q3_k => Q3_K,
    gpu_linear_iq4_xs => IQ4_XS
);

/// Every matvec work layout the kernels can be asked for ([`MatvecPlan`]: 32 to 256
/// invocations per row, one or two row groups per workgroup, 1 to 4 rows per invocation,
/// pipelines for 1 to 8 tokens) on the GPU layout: plain with bias and accumulate, with a
/// fused norm, and the fused GLU, over random types and shapes whose rows leave the last
/// workgroup partly empty, against the CPU references; y poisoned with NaN (past its end
/// too for the GLU).
#[test]
fn gpu_matvec_layouts_agree_with_the_references() {
    let Some(ctx) = gpu_or_skip("matvec_layouts") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let lin = Linear::with_layout(&ctx, false, f32_tuning(&ctx)).unwrap();
    let mut plans = vec![];
    for tpr in [32u32, 64, 128, 256] {
        for wg in [tpr, 2 * tpr] {
            for (maxt, rpt) in [(1u32, 1u32), (1, 4), (2, 2), (8, 1)] {
                let plan = MatvecPlan {
                    wg,
                    tpr,
                    maxt,
                    rpt,
                    blocks: false,
                };
                if wg <= 256 && plan.shared_bytes(false) <= ctx.caps().max_shared_memory {
                    plans.push(plan);
                }
            }
        }
    }
    // a random dozen per run (every pipeline compiles on lavapipe), those of the plans
    // `choose` makes always
    use rand::seq::SliceRandom;
    plans.shuffle(&mut rng);
    plans.truncate(12);
    for (rows, cols, tokens) in [
        (896, 896, 1),
        (896, 4864, 1),
        (896, 4864, 4),
        (65536, 896, 1),
        (4096, 4096, 1),
    ] {
        for chosen in [
            MatvecPlan::choose(rows, cols, tokens),
            MatvecPlan::choose_glu(rows, cols, tokens),
        ] {
            if !plans.contains(&chosen) {
                plans.push(chosen);
            }
        }
    }
    for plan in plans {
        let ty = TYPES[rng.gen_range(0..TYPES.len())];
        // pipelines for two or four tokens stage x 1024 columns at a time: half the cases
        // have a second, partial tile (and fewer rows, for lavapipe's time)
        let (n_rows, n_cols) = match ty.block_size() {
            bs if MatvecPlan::stages_x(plan.maxt) && bs > 1 && rng.gen_bool(0.5) => (
                rng.gen_range(37..80usize),
                bs * rng.gen_range(1056 / bs..=1800 / bs),
            ),
            _ => (rng.gen_range(37..200usize), random_cols(&mut rng, ty)),
        };
        let n_tokens = rng.gen_range(1..=plan.maxt as usize);
        check_plan(
            &ctx,
            &lin,
            plan,
            ty,
            (n_rows, n_cols, n_tokens),
            &mut rng,
            seed,
        );
    }
    assert_no_validation_errors(&ctx);
}

/// The one-token layouts of 32, 64 and 128 lanes a row, workgroups of one row or `wide` rows,
/// 1, 2 or 4 rows a lane; the block layout's or the others.
pub(super) fn one_token_layouts(wide: u32, blocks: bool) -> Vec<MatvecPlan> {
    let mut plans = vec![];
    for tpr in [32u32, 64, 128] {
        for wg in [tpr, wide * tpr] {
            for rpt in [1u32, 2, 4] {
                plans.push(MatvecPlan {
                    wg,
                    tpr,
                    maxt: 1,
                    rpt,
                    blocks,
                });
            }
        }
    }
    plans
}

/// The block layout (Q4_K, one token, 64 elements per invocation at a time) in every work
/// layout shape against the CPU references, as [`gpu_matvec_layouts_agree_with_the_references`]
/// (a random half per run, the chosen ones always), on rows of 512 to 2,560 columns; and the
/// weights it takes (whole pairs of super-blocks, one token, Q4_K only).
#[test]
fn gpu_block_layout_agrees_with_the_references() {
    let Some(ctx) = gpu_or_skip("matvec_blocks") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let lin = Linear::with_layout(&ctx, false, f32_tuning(&ctx)).unwrap();
    let mut plans = one_token_layouts(4, true);
    use rand::seq::SliceRandom;
    plans.shuffle(&mut rng);
    plans.truncate(9);
    for (rows, norm) in [(1024, true), (4096, false)] {
        let chosen = MatvecPlan::blocks(rows, 4096, norm).expect("the block layout's shapes");
        if !plans.contains(&chosen) {
            plans.push(chosen);
        }
    }
    assert_eq!(MatvecPlan::blocks(4096, 4096, true), None);
    assert_eq!(MatvecPlan::blocks(4096, 14336, false), None);
    for plan in plans {
        let n_rows = rng.gen_range(37..200usize);
        let n_cols = 512 * rng.gen_range(1..=5usize);
        check_plan(
            &ctx,
            &lin,
            plan,
            GgmlType::Q4_K,
            (n_rows, n_cols, 1),
            &mut rng,
            seed,
        );
    }
    let w = buffer_with(&ctx, "w", &[0u8; 288]);
    assert!(MatvecPlan::blocks_fit(
        GgmlType::Q4_K,
        512,
        1,
        &[&w.whole()]
    ));
    assert!(!MatvecPlan::blocks_fit(
        GgmlType::Q4_K,
        256,
        1,
        &[&w.whole()]
    ));
    assert!(!MatvecPlan::blocks_fit(
        GgmlType::Q4_K,
        512,
        2,
        &[&w.whole()]
    ));
    assert!(!MatvecPlan::blocks_fit(
        GgmlType::Q5_K,
        512,
        1,
        &[&w.whole()]
    ));
    assert_no_validation_errors(&ctx);
}

/// One matvec layout on random weights of `ty` (rows, columns, tokens): plain with bias and
/// accumulate, with a fused norm, and the fused GLU with the norm, against the CPU references;
/// y poisoned with NaN (past its end too for the GLU).
fn check_plan(
    ctx: &Context,
    lin: &Linear,
    plan: MatvecPlan,
    ty: GgmlType,
    (n_rows, n_cols, n_tokens): (usize, usize, usize),
    rng: &mut rand::rngs::StdRng,
    seed: u64,
) {
    use crate::testkit::{poisoned, read, with};
    let eps = 1e-6f32;
    let what = format!("{plan:?} {ty} {n_rows}x{n_cols}, {n_tokens} tokens, seed {seed}");
    let wq = random_weights(rng, ty, n_rows, n_cols);
    let uq = random_weights(rng, ty, n_rows, n_cols);
    let (wb, ub) = (buffer_with(ctx, "w", &wq), buffer_with(ctx, "u", &uq));
    let x: Vec<f32> = (0..n_tokens * n_cols)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let g: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(0.5..1.5)).collect();
    let bias: Vec<f32> = (0..n_rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let (xb, gb, bb) = (
        with(ctx, "x", &x),
        with(ctx, "g", &g),
        with(ctx, "b", &bias),
    );
    let (gs, bs) = (gb.whole(), bb.whole());
    let mut normed = vec![0f32; x.len()];
    crate::rms_norm_ref(&x, &g, &mut normed, n_cols, eps);
    let len = n_tokens * n_rows;
    let w = |data| QWeightRef {
        ty,
        data,
        n_rows: n_rows as u32,
        n_cols: n_cols as u32,
    };
    let (ws, us) = (wb.whole(), ub.whole());
    // plain (bias, accumulate) and with a fused norm
    for fused in [false, true] {
        let y0: Vec<f32> = (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let yb = with(ctx, "y", &y0);
        let args = LinearArgs {
            w: w(&ws),
            x: &xb.whole(),
            y: &yb.whole(),
            n_tokens: n_tokens as u32,
            y_stride: n_rows as u32,
            y_col: 0,
            bias: (!fused).then_some(&bs),
            accumulate: !fused,
            norm: fused.then_some((&gs, eps)),
            pending: None,
        };
        if fused {
            let nan = vec![f32::NAN; len];
            ctx.upload(&yb, 0, octoflow_vk::as_bytes(&nan)).unwrap();
        }
        let mut chain = Chain::new(ctx).unwrap();
        lin.record_with(&mut chain, &args, Some(plan)).unwrap();
        chain.run().unwrap();
        let got = read(ctx, &yb, len);
        let mut want = if fused { vec![0f32; len] } else { y0.clone() };
        let input = if fused { &normed } else { &x };
        let b = (!fused).then_some(&bias[..]);
        linear_ref(
            ty, &wq, n_rows, n_cols, input, n_tokens, &mut want, n_rows, 0, b, !fused,
        )
        .unwrap();
        if let Err(e) = check_close(&got, &want, REL) {
            panic!("{what} (fused norm {fused}): {e}");
        }
    }
    // the fused GLU with the norm
    let yb = poisoned(ctx, "y", len + 5);
    let args = LinearGluArgs {
        gate: w(&ws),
        up: w(&us),
        x: &xb.whole(),
        y: &yb.slice(0, 4 * len as u64).unwrap(),
        n_tokens: n_tokens as u32,
        op: GluOp::Silu,
        norm: Some((&gs, eps)),
        pending: None,
    };
    let mut chain = Chain::new(ctx).unwrap();
    lin.record_glu_with(&mut chain, &args, Some(plan), false)
        .unwrap();
    chain.run().unwrap();
    let got = read(ctx, &yb, len + 5);
    let mut want = vec![0f32; len];
    linear_glu_ref(
        ty,
        &wq,
        &uq,
        n_rows,
        n_cols,
        &normed,
        n_tokens,
        &mut want,
        GluOp::Silu,
    )
    .unwrap();
    if let Err(e) = check_close(&got[..len], &want, REL) {
        panic!("{what} (GLU): {e}");
    }
    assert!(
        got[len..].iter().all(|v| v.is_nan()),
        "{what}: written past y's end"
    );
}

#[test]
fn record_f32_gives_f32_products_at_any_batch() {
    let Some(ctx) = gpu_or_skip("linear_record_f32") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Linear::new(&ctx).unwrap();
    let ty = GgmlType::Q8_0;
    // batches for the matvec and past it (where a device with cooperative matrices would
    // otherwise take f16-rounded operands): the f32 bound holds
    for n_tokens in [1usize, 6, 40] {
        let (n_rows, n_cols) = (rng.gen_range(1..200), 32 * rng.gen_range(1..20));
        let w = random_weights(&mut rng, ty, n_rows, n_cols);
        let x = crate::testkit::random(&mut rng, n_tokens * n_cols);
        let (wb, xb) = (
            buffer_with(&ctx, "w", &w),
            crate::testkit::with(&ctx, "x", &x),
        );
        let yb = crate::testkit::poisoned(&ctx, "y", n_tokens * n_rows);
        let mut chain = Chain::new(&ctx).unwrap();
        k.record_f32(
            &mut chain,
            &LinearArgs {
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
            },
        )
        .unwrap();
        chain.run().unwrap();
        let mut want = vec![0f32; n_tokens * n_rows];
        linear_ref(
            ty, &w, n_rows, n_cols, &x, n_tokens, &mut want, n_rows, 0, None, false,
        )
        .unwrap();
        let got = crate::testkit::read(&ctx, &yb, n_tokens * n_rows);
        if let Err(e) = check_close(&got, &want, REL) {
            panic!("record_f32 {n_tokens} tokens, {n_rows}x{n_cols}, seed {seed}: {e}");
        }
    }
}
