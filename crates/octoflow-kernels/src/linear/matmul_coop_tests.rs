use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
use octoflow_vk::{Buffer, MemoryKind};
use rand::Rng;

use super::*;
use crate::check_close;
use crate::linear::QWeightRef;
use crate::testkit::{buffer_with, random_cols, random_weights};

/// The reference multiplies the same f16-rounded operands as the kernel (the decoding is
/// bit-exact: `qmad` in quant.glsl), so what is left is the f32 accumulation: products of
/// two f16 are exact in f32, and summing ≤ 1024 of them costs ≲ 1024 · 2⁻²⁴ · Σ|w·x| ≈ 1e-5
/// of the output scale even in the worst order, ≤ 2e-4 measured against the check's floor
/// (1% of the largest output). 1e-3 leaves margin, while a skipped f16 rounding of x or W
/// (errors ~2⁻¹² per product, ≳ 2e-3 near the floor), a misdecoded weight or a tile
/// mix-up (≥ 1e-2) fail it.
pub(crate) const REL_COOP: f32 = 1e-3;

/// The test device where it runs this kernel (else the test is skipped, saying why).
fn coop_device(name: &str) -> Option<octoflow_vk::Context> {
    let ctx = gpu_or_skip(name)?;
    if !MatmulCoop::supported(ctx.caps()) {
        println!(
            "{name}: skipped, {} has no 16x16x16 f16 -> f32 cooperative matrices",
            ctx.caps().name
        );
        return None;
    }
    Some(ctx)
}

/// Random shapes of `ty` straight through the coopmat kernel, every batch size path.
fn check_type(ty: GgmlType) {
    let Some(ctx) = coop_device(&format!("matmul_coop_{ty}")) else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    // The device's choice of tile for each batch, and each tile for every batch (the
    // choice takes the wide one only for large products, the small one for short ones).
    let ti = TYPES.iter().position(|&t| t == ty).unwrap();
    let tiled = |op: QOp, tile| MatmulCoop::with_shaders(&ctx, &[op.variant(ti)], tile).unwrap();
    let wide = tiled(QOp::MatmulCoopWide, TILE_WIDE);
    let narrow = tiled(QOp::MatmulCoop, TILE);
    let small = tiled(QOp::MatmulCoopSmall, TILE_SMALL);
    let full = MatmulCoop::new(&ctx).unwrap();
    // Tile edges: rows not a multiple of 64 (1 row too), columns a multiple of 32 but often
    // not of 64 (the kernel's K step), odd for F32/F16.
    let n_rows = if rng.gen_bool(0.2) {
        rng.gen_range(1..20usize)
    } else {
        rng.gen_range(65..400usize)
    };
    let n_cols = random_cols(&mut rng, ty);
    let wq = random_weights(&mut rng, ty, n_rows, n_cols);
    let wb = buffer_with(&ctx, "w", &wq);
    let bias: Vec<f32> = (0..n_rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let bb = buffer_with(&ctx, "bias", octoflow_vk::as_bytes(&bias));
    let sizes = [
        1usize,
        rng.gen_range(2..64),
        64,
        rng.gen_range(65..300),
        300,
    ];
    let runs = sizes.into_iter().enumerate().flat_map(|(case, n)| {
        [
            (case, n, "chosen", &full),
            (case, n, "wide", &wide),
            (case, n, "narrow", &narrow),
            (case, n, "small", &small),
        ]
    });
    for (case, n_tokens, tile, mm) in runs {
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
            vec![0.0; y_len]
        };
        let yb = buffer_with(&ctx, "y", octoflow_vk::as_bytes(&y0));
        if !accumulate {
            ctx.fill(&yb, 0, 4 * y_len as u64, f32::NAN.to_bits())
                .unwrap();
        }
        let bias_slice = with_bias.then(|| bb.whole());
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
            norm: None,
            pending: None,
        };
        // split-K: the device's choice, none, or 3 pieces (the sum adds bias / accumulates)
        let split = [0u32, 1, 3][case % 3];
        let mut chain = Chain::new(&ctx).unwrap();
        if split == 0 {
            mm.record(&mut chain, &args).unwrap();
        } else {
            let c = check_args(&args).unwrap();
            mm.dispatch_split(&mut chain, c.ti, &args, &c.bindings, &c.push, split)
                .unwrap();
        }
        chain.run().unwrap();
        let mut got = vec![0f32; y_len];
        ctx.download(&yb, 0, &mut got).unwrap();
        let mut want = if accumulate {
            y0.clone()
        } else {
            vec![f32::NAN; y_len]
        };
        matmul_coop_ref(
            ty,
            &wq,
            n_rows,
            n_cols,
            &x,
            n_tokens,
            &mut want,
            y_stride,
            y_col,
            with_bias.then_some(&bias[..]),
            accumulate,
        )
        .unwrap();
        let what = format!(
            "{ty} {n_rows}x{n_cols}, {n_tokens} tokens, {tile} tile, bias {with_bias}, \
             accumulate {accumulate}, y_col {y_col}, y_stride {y_stride}, split {split} (0: \
             auto), seed {seed}"
        );
        // One comparison over every token's outputs: check_close's floor (1% of the largest
        // |value|) then reflects the products' scale, not a single output that cancels to
        // ~1e-5 (a 1-row matrix has one output per token).
        let (mut g_in, mut w_in) = (Vec::new(), Vec::new());
        for t in 0..n_tokens {
            let row = t * y_stride;
            g_in.extend_from_slice(&got[row + y_col..row + y_col + n_rows]);
            w_in.extend_from_slice(&want[row + y_col..row + y_col + n_rows]);
        }
        if let Err(e) = check_close(&g_in, &w_in, REL_COOP) {
            panic!("{what}: outputs [token * {n_rows} + row]: {e}");
        }
        for t in 0..n_tokens {
            let row = t * y_stride;
            let inside = row + y_col..row + y_col + n_rows;
            for c in (row..row + y_stride).filter(|c| !inside.contains(c)) {
                assert_eq!(
                    got[c].to_bits(),
                    want[c].to_bits(),
                    "{what}: column {} of token {t} was written",
                    c - row
                );
            }
        }
    }
    assert_no_validation_errors(&ctx);
}

macro_rules! type_tests {
    ($check:ident: $($name:ident => $ty:ident),*) => {$(
        #[test]
        fn $name() {
            $check(GgmlType::$ty);
        }
    )*};
}

type_tests!(
    check_type: gpu_matmul_coop_f32 => F32, gpu_matmul_coop_f16 => F16, gpu_matmul_coop_q4_0 => Q4_0,
    gpu_matmul_coop_q4_1 => Q4_1, gpu_matmul_coop_q5_0 => Q5_0,
    gpu_matmul_coop_q5_1 => Q5_1, gpu_matmul_coop_q8_0 => Q8_0,
    gpu_matmul_coop_q4_k => Q4_K, gpu_matmul_coop_q5_k => Q5_K,
    gpu_matmul_coop_q6_k => Q6_K, gpu_matmul_coop_bf16 => BF16,
    gpu_matmul_coop_mxfp4 => MXFP4, gpu_matmul_coop_iq4_nl => IQ4_NL,
    gpu_matmul_coop_q2_k => Q2_K, gpu_matmul_coop_q3_k => Q3_K,
    gpu_matmul_coop_iq4_xs => IQ4_XS
);

/// Gate, up and the activation in one dispatch ([`crate::Linear::record_glu`] on batches
/// for this kernel) against the reference products of the f16-rounded operands and
/// [`crate::glu_ref`]: random shapes of `ty` (rows not a multiple of the 64-row tile, 1 to
/// 20 rows too, columns not a multiple of the 64-column step), batches of 9 to 300 tokens
/// (both tiles), both activations, the output poisoned first.
fn check_glu_type(ty: GgmlType) {
    let Some(ctx) = coop_device(&format!("matmul_coop_glu_{ty}")) else {
        return;
    };
    // batches of a few tokens stay on this kernel (not the 8-bit dot products)
    let tuning = crate::Tuning {
        dot_batches: crate::tuning::DotBatches::Off,
        ..crate::Tuning::from_caps(ctx.caps())
    };
    let lin = crate::Linear::with_tuning(&ctx, tuning).unwrap();
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    for case in 0..4 {
        let n_rows = if case == 0 {
            rng.gen_range(1..20usize)
        } else {
            rng.gen_range(65..400usize)
        };
        let n_cols = random_cols(&mut rng, ty);
        let n_tokens = [
            crate::linear::COOP_MIN_TOKENS as usize,
            rng.gen_range(10..=GLU_SMALL_MAX_TOKENS as usize),
            128,
            rng.gen_range(129..300),
        ][case];
        let op = [crate::GluOp::Silu, crate::GluOp::GeluTanh][case % 2];
        let wg = random_weights(&mut rng, ty, n_rows, n_cols);
        let wu = random_weights(&mut rng, ty, n_rows, n_cols);
        let x: Vec<f32> = (0..n_tokens * n_cols)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let (gb, ub) = (buffer_with(&ctx, "gate", &wg), buffer_with(&ctx, "up", &wu));
        let xb = buffer_with(&ctx, "x", octoflow_vk::as_bytes(&x));
        let n_out = n_tokens * n_rows;
        let yb = Buffer::new(&ctx, "y", 4 * n_out as u64, MemoryKind::DeviceLocal).unwrap();
        ctx.fill(&yb, 0, yb.size(), f32::NAN.to_bits()).unwrap();
        let weight = |data| QWeightRef {
            ty,
            data,
            n_rows: n_rows as u32,
            n_cols: n_cols as u32,
        };
        let (gs, us) = (gb.whole(), ub.whole());
        let args = crate::LinearGluArgs {
            gate: weight(&gs),
            up: weight(&us),
            x: &xb.whole(),
            y: &yb.whole(),
            n_tokens: n_tokens as u32,
            op,
            norm: None,
            pending: None,
        };
        assert!(lin.fuses_glu(n_tokens as u32, ty, ty));
        let mut chain = Chain::new(&ctx).unwrap();
        lin.record_glu(&mut chain, &args).unwrap();
        chain.run().unwrap();
        let mut got = vec![0f32; n_out];
        ctx.download(&yb, 0, &mut got).unwrap();
        let product = |w: &[u8]| {
            let mut y = vec![0f32; n_out];
            matmul_coop_ref(
                ty, w, n_rows, n_cols, &x, n_tokens, &mut y, n_rows, 0, None, false,
            )
            .unwrap();
            y
        };
        let (g, u) = (product(&wg), product(&wu));
        let mut want = vec![f32::NAN; n_out];
        crate::glu_ref(&g, &u, &mut want, op);
        if let Err(e) = check_close(&got, &want, REL_COOP) {
            panic!(
                "{ty} {n_rows}x{n_cols}, {n_tokens} tokens, {op:?}, seed {seed}: outputs \
                 [token * {n_rows} + row]: {e}"
            );
        }
    }
    assert_no_validation_errors(&ctx);
}

type_tests!(
    check_glu_type: gpu_matmul_coop_glu_f32 => F32, gpu_matmul_coop_glu_f16 => F16,
    gpu_matmul_coop_glu_q4_0 => Q4_0, gpu_matmul_coop_glu_q4_1 => Q4_1,
    gpu_matmul_coop_glu_q5_0 => Q5_0, gpu_matmul_coop_glu_q5_1 => Q5_1,
    gpu_matmul_coop_glu_q8_0 => Q8_0, gpu_matmul_coop_glu_q4_k => Q4_K,
    gpu_matmul_coop_glu_q5_k => Q5_K, gpu_matmul_coop_glu_q6_k => Q6_K
);

/// The tile rule on the models' shapes: the small tile for qwen2.5-0.5B's and gemma3's q
/// and k/v (as long a path, fewer split-K pieces), not for smollm2's 576 x 576 or gemma3's
/// 640 x 1024 output projection (a longer path) nor for FFN-sized products (measured
/// slower on the H100, see [`TILE_SMALL`]), on a device of 132 compute units (the H100's
/// SMs).
#[test]
fn small_tiles_take_short_products_whose_path_they_do_not_lengthen() {
    const TARGET_GROUPS: u32 = 132;
    let small =
        |rows, cols, tokens| prefers_small(TILE, TILE_SMALL, [rows, cols, tokens], TARGET_GROUPS);
    for (rows, cols) in [(896, 896), (128, 896), (1024, 640), (256, 640)] {
        assert!(small(rows, cols, 512), "{rows}x{cols}");
    }
    assert!(small(128, 896, 128));
    for (rows, cols) in [
        (576, 576),
        (640, 1024),
        (4864, 896),
        (896, 4864),
        (2048, 640),
    ] {
        assert!(!small(rows, cols, 512), "{rows}x{cols}");
    }
    assert!(!small(4864, 896, 128) && !small(896, 4864, 128));
    // one wave: 896 x 896 at 512 tokens in 128 x 64 tiles is 56 tiles, two pieces each
    assert_eq!(split_for(56, 896, 64, TARGET_GROUPS), 2);
    assert_eq!(wave_cost(TILE, [896, 896, 512], TARGET_GROUPS), 14);
    assert_eq!(wave_cost(TILE_SMALL, [896, 896, 512], TARGET_GROUPS), 14);
}

#[test]
fn without_cooperative_matrices_new_is_a_clear_error() {
    let Some(ctx) = gpu_or_skip("matmul_coop_unsupported") else {
        return;
    };
    if MatmulCoop::supported(ctx.caps()) {
        // Bad shapes still fail before anything is recorded.
        let mm = MatmulCoop::new(&ctx).unwrap();
        let b = Buffer::new(&ctx, "b", 64, MemoryKind::DeviceLocal).unwrap();
        let args = LinearArgs {
            w: QWeightRef {
                ty: GgmlType::Q8_0,
                data: &b.whole(),
                n_rows: 8,
                n_cols: 64,
            },
            x: &b.whole(),
            y: &b.whole(),
            n_tokens: 2,
            y_stride: 8,
            y_col: 0,
            bias: None,
            accumulate: false,
            norm: None,
            pending: None,
        };
        let mut chain = Chain::new(&ctx).unwrap();
        let e = mm.record(&mut chain, &args).map(|_| ()).unwrap_err();
        assert!(e.to_string().contains("weights"), "{e}");
        return;
    }
    let e = MatmulCoop::new(&ctx).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("cooperative matrices"), "{e}");
}
