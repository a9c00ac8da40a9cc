use octoflow_gguf::GgmlType;
use octoflow_vk::testing::{
    assert_no_validation_errors, gpu_or_skip, gpu_with_integer_dot_or_skip,
};
use octoflow_vk::{Chain, Context};
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::linear::{linear_ref, Linear, QWeightRef};
use crate::testkit::{buffer_with, poisoned, random_weights, read, seeded, with};
use crate::tuning::{DotBatches, Tuning};

/// Bound relative to the larger of |want| and 1% of the largest |want| (as `check_close`).
const REL: f64 = 2e-4;

/// `got[r]` within `REL` of `want[r]` plus the row's slack (codes of x at a rounding boundary).
fn check_rows(got: &[f32], want: &[f32], slack: &[f64], what: &str) {
    crate::testkit::check_with_slack(got, want, slack, REL, what);
}

/// The device's tuning with every product of 1 to 8 tokens of a type the kernel reads sent to
/// it (`on`), or none.
fn dot_tuning(ctx: &Context, on: bool) -> Tuning {
    Tuning {
        matvec_dot: on,
        // every one-token product of a type it reads, however small
        dot_min_weights: if on { 0 } else { u64::MAX },
        dot_batches: if on { DotBatches::All } else { DotBatches::Off },
        quantize_once: false,
        ..Tuning::from_caps(ctx.caps())
    }
}

fn dot_linear(ctx: &Context, on: bool) -> Linear {
    Linear::with_layout(ctx, false, dot_tuning(ctx, on)).unwrap()
}

/// x of `n` values in -1 .. 1 with one block of 32 all zeros (its scale 0) where there are two
/// or more blocks.
fn random_x(rng: &mut StdRng, n: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    if n >= 64 {
        let b = rng.gen_range(0..n / 32);
        x[32 * b..32 * b + 32].fill(0.0);
    }
    x
}

/// One shape of `nt` tokens: the plain product (bias, accumulate, at a column offset of a
/// wider y), the product of the fused norm, and the fused GLU with and without the norm, each
/// against [`matvec_dot_ref`] / [`matvec_dot_glu_ref`] token by token with y poisoned where it
/// is written fresh; the norm's product also against the f32 reference, within what codes off
/// by up to half a step can move it.
fn check_shape(
    ctx: &Context,
    lin: &Linear,
    ty: GgmlType,
    (n_rows, n_cols, nt): (usize, usize, usize),
    rng: &mut StdRng,
    seed: u64,
) {
    let what = format!("{ty} {n_rows}x{n_cols}, {nt} tokens, seed {seed}");
    let eps = 1e-5f32;
    let wq = random_weights(rng, ty, n_rows, n_cols);
    let uq = random_weights(rng, ty, n_rows, n_cols);
    let (wb, ub) = (buffer_with(ctx, "w", &wq), buffer_with(ctx, "u", &uq));
    let x: Vec<f32> = (0..nt).flat_map(|_| random_x(rng, n_cols)).collect();
    let g: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(0.5..1.5)).collect();
    let bias: Vec<f32> = (0..n_rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let (xb, gb, bb) = (
        with(ctx, "x", &x),
        with(ctx, "g", &g),
        with(ctx, "b", &bias),
    );
    let (ws, us, gs, bs) = (wb.whole(), ub.whole(), gb.whole(), bb.whole());
    let weight = |ty, data| QWeightRef {
        ty,
        data,
        n_rows: n_rows as u32,
        n_cols: n_cols as u32,
    };
    let xt = |t: usize| &x[t * n_cols..(t + 1) * n_cols];
    // plain: bias and accumulate into columns [3, 3 + n_rows) of rows of n_rows + 5
    let stride = n_rows + 5;
    let y0: Vec<f32> = (0..nt * stride).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let yb = with(ctx, "y", &y0);
    let mut chain = Chain::new(ctx).unwrap();
    lin.record(
        &mut chain,
        &LinearArgs {
            w: weight(ty, &ws),
            x: &xb.whole(),
            y: &yb.whole(),
            n_tokens: nt as u32,
            y_stride: stride as u32,
            y_col: 3,
            bias: Some(&bs),
            accumulate: true,
            norm: None,
            pending: None,
        },
    )
    .unwrap();
    chain.run().unwrap();
    let got = read(ctx, &yb, nt * stride);
    for t in 0..nt {
        let (o, what) = (t * stride, format!("{what}, token {t}"));
        let mut want = y0[o..o + stride].to_vec();
        let slack = matvec_dot_ref(
            ty,
            &wq,
            n_rows,
            n_cols,
            xt(t),
            None,
            &mut want,
            3,
            Some(&bias),
            true,
        )
        .unwrap();
        assert_eq!(
            got[o..o + 3],
            y0[o..o + 3],
            "{what}: columns before y_col written"
        );
        assert_eq!(
            got[o + 3 + n_rows..o + stride],
            y0[o + 3 + n_rows..o + stride],
            "{what}: written past"
        );
        check_rows(
            &got[o + 3..o + 3 + n_rows],
            &want[3..3 + n_rows],
            &slack,
            &what,
        );
    }

    // the fused norm, y poisoned
    let yb = poisoned(ctx, "y", nt * n_rows + 4);
    let mut chain = Chain::new(ctx).unwrap();
    lin.record(
        &mut chain,
        &LinearArgs {
            w: weight(ty, &ws),
            x: &xb.whole(),
            y: &yb.slice(0, 4 * (nt * n_rows) as u64).unwrap(),
            n_tokens: nt as u32,
            y_stride: n_rows as u32,
            y_col: 0,
            bias: None,
            accumulate: false,
            norm: Some((&gs, eps)),
            pending: None,
        },
    )
    .unwrap();
    chain.run().unwrap();
    let all = read(ctx, &yb, nt * n_rows + 4);
    assert!(
        all[nt * n_rows..].iter().all(|v| v.is_nan()),
        "{what}: past y"
    );
    let rb = octoflow_gguf::quant::quantized_size(ty, n_cols).unwrap();
    let mut row = vec![0f32; n_cols];
    for t in 0..nt {
        let (x, what) = (xt(t), format!("{what}, token {t}"));
        let got = &all[t * n_rows..(t + 1) * n_rows];
        let mut want = vec![0f32; n_rows];
        let slack = matvec_dot_ref(
            ty,
            &wq,
            n_rows,
            n_cols,
            x,
            Some((&g, eps)),
            &mut want,
            0,
            None,
            false,
        )
        .unwrap();
        check_rows(got, &want, &slack, &format!("{what} (norm)"));
        // the 8-bit codes move the f32 product by well under a percent of its scale
        let mut normed = vec![0f32; n_cols];
        crate::rms_norm_ref(x, &g, &mut normed, n_cols, eps);
        let mut exact = vec![0f32; n_rows];
        linear_ref(
            ty, &wq, n_rows, n_cols, &normed, 1, &mut exact, n_rows, 0, None, false,
        )
        .unwrap();
        // each code of x is within half a step (its block's d / 2) of x * g, so each row is
        // within (sum over i of |w_i| d / 2) / rms(x) of the f32 product, whatever the draw
        let half_steps: Vec<f64> = x
            .chunks(32)
            .zip(g.chunks(32))
            .flat_map(|(xb, gb)| {
                let amax = xb
                    .iter()
                    .zip(gb)
                    .fold(0f32, |m, (&a, &b)| m.max((a * b).abs()));
                vec![f64::from(amax) / 127.0 / 2.0; xb.len()]
            })
            .collect();
        let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let inv = 1.0 / (ss / n_cols as f64 + f64::from(eps)).sqrt();
        let scale = exact.iter().fold(0f64, |m, &e| m.max(f64::from(e).abs()));
        for r in 0..n_rows {
            octoflow_gguf::quant::dequantize(ty, &wq[r * rb..(r + 1) * rb], &mut row).unwrap();
            let bound: f64 = inv
                * row
                    .iter()
                    .zip(&half_steps)
                    .map(|(&w, &h)| f64::from(w.abs()) * h)
                    .sum::<f64>()
                + REL * scale;
            let err = (f64::from(got[r]) - f64::from(exact[r])).abs();
            assert!(
                err <= bound,
                "{what} (norm) row {r}: {} against the f32 product {} (beyond half a code step: {err:.3e} > {bound:.3e})",
                got[r],
                exact[r]
            );
        }
    }

    // the fused GLU, with the norm (SiLU) and without (GELU)
    for (norm, op) in [(true, GluOp::Silu), (false, GluOp::GeluTanh)] {
        let yb = poisoned(ctx, "y", nt * n_rows + 4);
        let mut chain = Chain::new(ctx).unwrap();
        lin.record_glu(
            &mut chain,
            &LinearGluArgs {
                gate: weight(ty, &ws),
                up: weight(ty, &us),
                x: &xb.whole(),
                y: &yb.slice(0, 4 * (nt * n_rows) as u64).unwrap(),
                n_tokens: nt as u32,
                op,
                norm: norm.then_some((&gs, eps)),
                pending: None,
            },
        )
        .unwrap();
        chain.run().unwrap();
        let all = read(ctx, &yb, nt * n_rows + 4);
        assert!(
            all[nt * n_rows..].iter().all(|v| v.is_nan()),
            "{what}: past y"
        );
        let nrm = norm.then_some((&g[..], eps));
        for t in 0..nt {
            let (x, got) = (xt(t), &all[t * n_rows..(t + 1) * n_rows]);
            let mut want = vec![0f32; n_rows];
            let slack =
                matvec_dot_glu_ref(ty, &wq, &uq, n_rows, n_cols, x, nrm, &mut want, op).unwrap();
            // a gate or up moved by its slack moves act(gate) * up by at most about this much
            let (mut gate, mut up) = (vec![0f32; n_rows], vec![0f32; n_rows]);
            matvec_dot_ref(ty, &wq, n_rows, n_cols, x, nrm, &mut gate, 0, None, false).unwrap();
            matvec_dot_ref(ty, &uq, n_rows, n_cols, x, nrm, &mut up, 0, None, false).unwrap();
            let glu_slack: Vec<f64> = slack
                .iter()
                .zip(gate.iter().zip(&up))
                .map(|(&(sg, su), (&gv, &uv))| {
                    1.2 * sg * f64::from(uv).abs() + (f64::from(gv).abs() + sg) * su
                })
                .collect();
            check_rows(
                got,
                &want,
                &glu_slack,
                &format!("{what}, token {t} (GLU, norm {norm})"),
            );
        }
    }
}

/// The integer-dot kernel against its CPU reference on fresh random weights of every type it
/// reads and inputs of one to eight tokens: rows not a multiple of the workgroup's 16, rows of
/// a few blocks to a few super-blocks (odd super-block counts put Q6_K's 210-byte rows at
/// 2-byte alignment every other row; Q4_0, Q5_0 and Q8_0 blocks alternate between 4- and 2-byte
/// alignment), rows as wide as an 8B model's down projection, whose eight tokens take more
/// shared memory than a workgroup has (the tokens split over workgroups), and matrices tall
/// enough for four rows a row group.
#[test]
fn gpu_matvec_dot_agrees_with_its_reference() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("matvec_dot") else {
        return;
    };
    let (seed, mut rng) = seeded(module_path!());
    let lin = dot_linear(&ctx, true);
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        for nt in [1, 2, rng.gen_range(3..=8usize)] {
            let n_rows = rng.gen_range(1..300usize);
            let n_cols = 256 * rng.gen_range(1..=12usize);
            check_shape(&ctx, &lin, ty, (n_rows, n_cols, nt), &mut rng, seed);
        }
        check_shape(&ctx, &lin, ty, (19, 14336, 1), &mut rng, seed);
    }
    for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
        for nt in [1, 2, rng.gen_range(3..=8usize)] {
            let n_rows = rng.gen_range(1..300usize);
            let n_cols = 64 * rng.gen_range(1..=40usize);
            check_shape(&ctx, &lin, ty, (n_rows, n_cols, nt), &mut rng, seed);
        }
    }
    for ty in [GgmlType::Q4_1, GgmlType::Q5_1] {
        for nt in [1, 2, rng.gen_range(3..=8usize)] {
            let n_rows = rng.gen_range(1..300usize);
            let n_cols = 32 * rng.gen_range(1..=80usize);
            check_shape(&ctx, &lin, ty, (n_rows, n_cols, nt), &mut rng, seed);
        }
    }
    check_shape(&ctx, &lin, GgmlType::Q4_K, (21, 14336, 8), &mut rng, seed);
    // matrices tall enough for four rows a row group in batches
    let units = ctx
        .caps()
        .compute_units
        .unwrap_or(crate::tuning::FALLBACK_COMPUTE_UNITS) as usize;
    for ty in [GgmlType::Q5_0, GgmlType::Q6_K] {
        let n_rows = 64 * units + rng.gen_range(1..32usize);
        check_shape(&ctx, &lin, ty, (n_rows, 256, 3), &mut rng, seed);
    }
    assert_no_validation_errors(&ctx);
}

/// The products on 8-bit dots with x quantized once per product (`Tuning::quantize_once`).
fn once_linear(ctx: &octoflow_vk::Context) -> Linear {
    let tuning = Tuning {
        quantize_once: true,
        ..dot_tuning(ctx, true)
    };
    Linear::with_layout(ctx, false, tuning).unwrap()
}

/// The same products on x quantized once for each (`Tuning::quantize_once`: quantize_q8.comp,
/// then the XQ variants) for every type, one and several tokens, the norm fused and the GLU
/// (`check_shape`), and eight tokens of 14,336-wide rows split over workgroups (each reads its
/// tokens' share of the quantized x).
#[test]
fn gpu_matvec_dot_on_x_quantized_once_agrees_with_its_reference() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("matvec_dot_once") else {
        return;
    };
    let (seed, mut rng) = seeded(module_path!());
    let lin = once_linear(&ctx);
    for ty in DOT_TYPES {
        let multiple = if ty.block_size() == 256 { 256 } else { 64 };
        for nt in [1, rng.gen_range(2..=8usize)] {
            let n_rows = rng.gen_range(1..200usize);
            let n_cols = multiple * rng.gen_range(1..=8usize);
            check_shape(&ctx, &lin, ty, (n_rows, n_cols, nt), &mut rng, seed);
        }
    }
    check_shape(&ctx, &lin, GgmlType::Q4_K, (21, 14336, 8), &mut rng, seed);
    assert_no_validation_errors(&ctx);
}

/// Products of one input recorded together (`StepLinear::record_many`, a block's Q, K and V)
/// share one quantization of x where `Tuning::quantize_once` holds: one quantize dispatch and
/// the products, each equal to its reference with the norm fused; products of other inputs are
/// recorded one by one.
#[test]
fn gpu_products_of_one_input_share_its_quantization() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("matvec_dot_many") else {
        return;
    };
    let (seed, mut rng) = seeded(module_path!());
    let lin = once_linear(&ctx);
    let (nt, n_cols, eps) = (3usize, 512usize, 1e-5f32);
    let shapes = [
        (GgmlType::Q4_K, 40usize),
        (GgmlType::Q8_0, 24),
        (GgmlType::Q6_K, 9),
    ];
    let w: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(ty, rows)| random_weights(&mut rng, ty, rows, n_cols))
        .collect();
    let wb: Vec<_> = w.iter().map(|b| buffer_with(&ctx, "w", b)).collect();
    let x: Vec<f32> = (0..nt).flat_map(|_| random_x(&mut rng, n_cols)).collect();
    let g: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(0.5..1.5)).collect();
    let (xb, x2b, gb) = (
        with(&ctx, "x", &x),
        with(&ctx, "x2", &x),
        with(&ctx, "g", &g),
    );
    let yb: Vec<_> = shapes
        .iter()
        .map(|&(_, rows)| poisoned(&ctx, "y", nt * rows))
        .collect();
    let (ws, ys): (Vec<_>, Vec<_>) = (
        wb.iter().map(|b| b.whole()).collect(),
        yb.iter().map(|b| b.whole()).collect(),
    );
    let (xs, x2s, gs) = (xb.whole(), x2b.whole(), gb.whole());
    let args = |i: usize, x| LinearArgs {
        w: QWeightRef {
            ty: shapes[i].0,
            data: &ws[i],
            n_rows: shapes[i].1 as u32,
            n_cols: n_cols as u32,
        },
        x,
        y: &ys[i],
        n_tokens: nt as u32,
        y_stride: shapes[i].1 as u32,
        y_col: 0,
        bias: None,
        accumulate: false,
        norm: Some((&gs, eps)),
        pending: None,
    };
    let mut chain = Chain::new(&ctx).unwrap();
    let all: Vec<_> = (0..3).map(|i| args(i, &xs)).collect();
    lin.step(true).record_many(&mut chain, &all).unwrap();
    assert_eq!(
        chain.dispatch_count(),
        4,
        "one quantization and three products"
    );
    chain.run().unwrap();
    for (i, &(ty, rows)) in shapes.iter().enumerate() {
        let got = read(&ctx, &yb[i], nt * rows);
        for t in 0..nt {
            let mut want = vec![0f32; rows];
            let xt = &x[t * n_cols..(t + 1) * n_cols];
            let slack = matvec_dot_ref(
                ty,
                &w[i],
                rows,
                n_cols,
                xt,
                Some((&g, eps)),
                &mut want,
                0,
                None,
                false,
            )
            .unwrap();
            let what = format!("{ty} {rows}x{n_cols}, token {t}, seed {seed}");
            check_rows(&got[t * rows..(t + 1) * rows], &want, &slack, &what);
        }
    }
    // another input (the same values in another buffer): each product quantizes its own
    let mut chain = Chain::new(&ctx).unwrap();
    lin.step(true)
        .record_many(&mut chain, &[args(0, &xs), args(1, &x2s)])
        .unwrap();
    assert_eq!(
        chain.dispatch_count(),
        4,
        "two quantizations and two products"
    );
    assert_no_validation_errors(&ctx);
}

/// What the kernel takes: one to eight tokens of the types it reads, rows of whole super-blocks
/// (K-quants) or of whole words of blocks up to its width, from aligned offsets, without a
/// pending post-norm; what the tuning sends it; and with the tuning off the product is the f32
/// matvec's (equal to the f32 reference, which the 8-bit codes are not).
#[test]
fn gpu_matvec_dot_takes_only_what_it_reads() {
    let Some(ctx) = gpu_or_skip("matvec_dot_fits") else {
        return;
    };
    if let Some(dot) = MatvecDot::new(&ctx, None).unwrap() {
        let w = buffer_with(&ctx, "w", &[0u8; 4096]);
        let (a, b) = (w.whole(), w.slice(8, 1024).unwrap());
        let fits = |ty, glu, cols, tokens, pending, s: &BufferSlice| {
            dot.fits(ty, glu, cols, tokens, pending, &[s])
        };
        use GgmlType::*;
        assert!(fits(Q4_K, false, 256, 1, false, &a));
        assert!(fits(Q4_K, false, MATVEC_DOT_MAX_COLS, 1, false, &a));
        assert!(!fits(Q4_K, false, MATVEC_DOT_MAX_COLS + 256, 1, false, &a));
        assert!(!fits(Q4_K, false, 384, 1, false, &a));
        assert!(fits(Q4_K, false, 256, 8, false, &a));
        assert!(!fits(Q4_K, false, 256, 9, false, &a));
        assert!(!fits(Q4_K, false, 256, 1, true, &a));
        assert!(!fits(Q4_K, false, 256, 1, false, &b));
        for ty in [Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0] {
            assert!(fits(ty, false, 256, 1, false, &a), "{ty}");
            assert!(fits(ty, true, 256, 4, false, &a), "{ty} GLU");
        }
        assert!(fits(Q8_0, false, 256, 2, false, &b));
        assert!(!fits(Q8_0, false, 96, 2, false, &a));
        assert!(fits(Q4_1, false, 96, 2, false, &a));
        assert!(!fits(F16, false, 256, 2, false, &a));
        assert!(!fits(Q2_K, false, 256, 2, false, &a));
        let mut t = Tuning {
            matvec_dot: true,
            dot_batches: DotBatches::Off,
            ..Tuning::from_caps(ctx.caps())
        };
        for decode in [false, true] {
            assert!(MatvecDot::takes(&t, Q4_K, 64, 1, decode));
            assert!(!MatvecDot::takes(&t, Q8_0, 1 << 30, 1, decode));
            assert!(!MatvecDot::takes(&t, Q8_0, 64, 2, decode));
        }
        t.dot_batches = DotBatches::Decode;
        assert!(
            MatvecDot::takes(&t, Q8_0, 64, 2, true) && !MatvecDot::takes(&t, Q8_0, 64, 2, false)
        );
        t.dot_batches = DotBatches::All;
        assert!(MatvecDot::takes(&t, Q8_0, 64, 2, false));
        assert!(MatvecDot::takes(&t, Q6_K, 64, 8, false));
        assert!(!MatvecDot::takes(&t, F16, 64, 2, true));
        // large one-token products of the blocks of 32 from dot_min_weights
        t.dot_min_weights = 1 << 20;
        assert!(MatvecDot::takes(&t, Q8_0, 1 << 20, 1, false));
        assert!(!MatvecDot::takes(&t, Q8_0, (1 << 20) - 1, 1, false));
        assert!(!MatvecDot::takes(&t, Q2_K, 1 << 30, 1, false));
        t.matvec_dot = false;
        assert!(!MatvecDot::takes(&t, Q4_K, 64, 1, true));
        assert!(!MatvecDot::takes(&t, Q8_0, 1 << 20, 1, true));
        // batches of a few tokens leave the cooperative-matrix kernel for it
        let lin = Linear::with_layout(&ctx, false, t).unwrap();
        assert!(!lin.uses_coop(8));
        assert!(lin.fuses_norm(8));
        // with decode steps only, a prompt's batch keeps its kernel
        t.dot_batches = DotBatches::Decode;
        let lin = Linear::with_layout(&ctx, false, t).unwrap();
        assert!(lin.step(true).dot_batch(8) && !lin.dot_batch(8));
        assert!(!lin.step(true).uses_coop(8));
        assert_eq!(lin.uses_coop(8), lin.coop.is_some());
    }

    let (seed, mut rng) = seeded(module_path!());
    let (n_rows, n_cols) = (40, 512);
    let wq = random_weights(&mut rng, GgmlType::Q4_K, n_rows, n_cols);
    let wb = buffer_with(&ctx, "w", &wq);
    let x = random_x(&mut rng, n_cols);
    let xb = with(&ctx, "x", &x);
    let mut exact = vec![0f32; n_rows];
    linear_ref(
        GgmlType::Q4_K,
        &wq,
        n_rows,
        n_cols,
        &x,
        1,
        &mut exact,
        n_rows,
        0,
        None,
        false,
    )
    .unwrap();
    let run = |lin: &Linear| {
        let yb = poisoned(&ctx, "y", n_rows);
        let mut chain = Chain::new(&ctx).unwrap();
        lin.record(
            &mut chain,
            &LinearArgs {
                w: QWeightRef {
                    ty: GgmlType::Q4_K,
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
            },
        )
        .unwrap();
        chain.run().unwrap();
        read(&ctx, &yb, n_rows)
    };
    let off = run(&dot_linear(&ctx, false));
    crate::check_close(&off, &exact, 5e-4)
        .unwrap_or_else(|e| panic!("tuning off, seed {seed}: {e}"));
    if ctx.caps().integer_dot_product {
        let on = run(&dot_linear(&ctx, true));
        let mut want = vec![0f32; n_rows];
        let slack = matvec_dot_ref(
            GgmlType::Q4_K,
            &wq,
            n_rows,
            n_cols,
            &x,
            None,
            &mut want,
            0,
            None,
            false,
        )
        .unwrap();
        check_rows(&on, &want, &slack, &format!("tuning on, seed {seed}"));
        assert!(
            on.iter().zip(&exact).any(|(a, b)| a != b),
            "seed {seed}: the 8-bit path gave the f32 product exactly"
        );
    }
    assert_no_validation_errors(&ctx);
}

/// The work layout's choices on an H100's and lavapipe's limits: the tokens of a batch split
/// evenly over as few workgroups as shared memory allows (never past it where one token fits),
/// and four rows a row group only for batches over matrices tall enough to give every compute
/// unit two workgroups.
#[test]
fn layouts_fit_shared_memory_and_split_tokens_evenly() {
    let h100 = DotLayout {
        max_shared: 49152,
        subgroup: 32,
        units: 132,
    };
    let lavapipe = DotLayout {
        max_shared: 32768,
        subgroup: 8,
        units: 128,
    };
    for l in [h100, lavapipe] {
        for cols in [256u32, 896, 4096, 4864, 14336] {
            for glu in [false, true] {
                for rows in [128u32, 4096, 20000] {
                    for nt in 1..=MATVEC_MAX_TOKENS {
                        let rpt = l.rows_per_group(rows, nt);
                        let per = l.tokens_per_group(cols, nt, glu, rpt);
                        let what = format!("{l:?}: {rows}x{cols}, {nt} tokens, GLU {glu}");
                        assert!((1..=nt).contains(&per), "{what}: {per} a workgroup");
                        let groups = nt.div_ceil(per);
                        assert!(per * (groups - 1) < nt, "{what}: an empty workgroup");
                        if l.shared_bytes(1, cols, glu, rpt) <= l.max_shared {
                            assert!(
                                l.shared_bytes(per, cols, glu, rpt) <= l.max_shared,
                                "{what}: {per} tokens past shared memory"
                            );
                            // as few workgroups as fit: fewer would take too many tokens each
                            if groups > 1 {
                                let fewer = nt.div_ceil(groups - 1);
                                assert!(
                                    l.shared_bytes(fewer, cols, glu, rpt) > l.max_shared,
                                    "{what}: {groups} workgroups where {} would do",
                                    groups - 1
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    // 8 tokens of 4,096 columns in one workgroup on the H100 (5,700 bytes a token); of 14,336
    // columns (19,780 a token) two a workgroup
    assert_eq!(h100.tokens_per_group(4096, 8, false, RPT), 8);
    assert_eq!(h100.tokens_per_group(14336, 8, false, RPT), 2);
    // tall: 2 units x 8 row groups x 4 rows
    assert_eq!(h100.rows_per_group(2 * 132 * 32, 2), RPT_TALL);
    assert_eq!(h100.rows_per_group(2 * 132 * 32 - 1, 2), RPT);
    assert_eq!(h100.rows_per_group(100_000, 1), RPT);
}
