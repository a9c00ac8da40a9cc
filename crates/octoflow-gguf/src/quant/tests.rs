//! Round trips, fused dots and error cases of the quant codecs. The bit-exact comparisons with
//! gguf-py and ggml are in tests/quant_fixtures.rs.
//!
//! Random-input tests draw a fresh seed each run and print it on failure; rerun one with
//! `OCTOFLOW_TEST_SEED=<seed>`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::types::QK_K;

/// Elements per random test vector: whole blocks of every format.
const N: usize = 8 * QK_K;

fn seed() -> u64 {
    std::env::var("OCTOFLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// Standard normal samples (Box–Muller), as weights roughly are.
fn normal(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let (u, v): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect()
}

/// Test inputs: Gaussian, uniform, Gaussian with outliers, one-signed, and a small-scale
/// Gaussian (weights of a trained layer are around 0.02).
fn inputs(rng: &mut StdRng) -> Vec<(&'static str, Vec<f32>)> {
    let g = normal(rng, N);
    let mut outliers = normal(rng, N);
    for _ in 0..N / 64 {
        let i = rng.gen_range(0..N);
        outliers[i] *= 8.0;
    }
    vec![
        (
            "uniform",
            (0..N).map(|_| rng.gen_range(-1.0..1.0)).collect(),
        ),
        ("outliers", outliers),
        ("negative", g.iter().map(|v| -v.abs()).collect()),
        ("small", g.iter().map(|v| v * 0.02).collect()),
        ("normal", g),
    ]
}

fn relative_rms_error(x: &[f32], y: &[f32]) -> f64 {
    let (mut err, mut norm) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(y) {
        err += (a as f64 - b as f64).powi(2);
        norm += (a as f64).powi(2);
    }
    (err / norm).sqrt()
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; quantized_size(ty, x.len()).unwrap()];
    quantize(ty, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    y
}

/// Upper bounds of the relative RMS round-trip error: on typical inputs (normal, uniform,
/// one-signed, small-scale) and on Gaussian input with 8σ outliers, which stretch the block
/// scales. Typical bounds are about 1.2× the worst value measured over 150 seeds; outlier
/// bounds, whose spread is wider, about 1.5×. Ordered by bits per weight.
const ROUND_TRIP_BOUNDS: &[(GgmlType, f64, f64)] = &[
    (GgmlType::F32, 0.0, 0.0),
    // Rounding to nearest keeps every element within half an ulp: 2^-11 and 2^-8 relative.
    (GgmlType::F16, 4.9e-4, 4.9e-4),
    (GgmlType::BF16, 3.9e-3, 3.9e-3),
    (GgmlType::Q8_0, 0.0075, 0.02),
    (GgmlType::Q8_1, 0.0075, 0.02),
    (GgmlType::Q8_K, 0.01, 0.05),
    (GgmlType::Q6_K, 0.025, 0.05),
    (GgmlType::Q5_0, 0.055, 0.12),
    (GgmlType::Q5_1, 0.05, 0.09),
    (GgmlType::Q5_K, 0.045, 0.065),
    (GgmlType::Q4_0, 0.11, 0.2),
    (GgmlType::Q4_1, 0.1, 0.17),
    (GgmlType::Q4_K, 0.09, 0.13),
    (GgmlType::Q3_K, 0.19, 0.27),
    (GgmlType::Q2_K, 0.37, 0.5),
    (GgmlType::MXFP4, 0.18, 0.3),
];

#[test]
fn every_quantizer_round_trips_within_its_error_bound() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    for (case, x) in inputs(&mut rng) {
        for &(ty, typical, outliers) in ROUND_TRIP_BOUNDS {
            let bound = if case == "outliers" {
                outliers
            } else {
                typical
            };
            let err = relative_rms_error(&x, &round_trip(ty, &x));
            // Written so that a NaN error fails.
            assert!(
                err <= bound,
                "seed {seed}: {ty} round trip of {case} input has relative RMS error {err}, bound {bound}"
            );
        }
    }
}

#[test]
fn bound_table_covers_every_quantizer() {
    for &ty in crate::types::ALL {
        let listed = ROUND_TRIP_BOUNDS.iter().any(|&(t, _, _)| t == ty);
        assert_eq!(listed, can_quantize(ty), "{ty}");
    }
}

#[test]
fn zeros_and_constants_round_trip_without_nan() {
    for &(ty, _, _) in ROUND_TRIP_BOUNDS {
        for c in [0.0f32, 1.0, -0.5, 3.0e4, 1.0e-3] {
            let x = vec![c; QK_K];
            let y = round_trip(ty, &x);
            let err = relative_rms_error(&x, &y);
            assert!(
                y.iter().all(|v| v.is_finite()),
                "{ty}: constant {c} gives {y:?}"
            );
            if c != 0.0 {
                // Constants are not exactly representable in every format (K-quant mins), but
                // must come back close. ggml's MXFP4 scale puts the largest magnitude in
                // [1, 2)·2^k while its largest code is 1.5·2^k: it clips by up to 25%.
                let bound = if ty == GgmlType::MXFP4 { 0.25 } else { 0.05 };
                assert!(
                    err <= bound,
                    "{ty}: constant {c} comes back with error {err}"
                );
            } else {
                assert!(y.iter().all(|&v| v == 0.0), "{ty}: zeros give {y:?}");
            }
        }
    }
}

/// Quantized random data of every dequantizable type: quantized Gaussians where a quantizer
/// exists, random bytes with a sane f16 scale otherwise.
fn random_rows(rng: &mut StdRng, ty: GgmlType, n: usize) -> Vec<u8> {
    let mut q = vec![0u8; quantized_size(ty, n).unwrap()];
    if can_quantize(ty) {
        quantize(ty, &normal(rng, n), &mut q).unwrap();
    } else {
        rng.fill(&mut q[..]);
        for b in q.chunks_exact_mut(ty.type_size()) {
            put_f16(b, 0, rng.gen_range(-0.05..0.05));
        }
    }
    q
}

#[test]
fn dot_row_agrees_with_dequantize_then_dot() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    for &ty in crate::types::ALL.iter().filter(|&&t| can_dequantize(t)) {
        let row = random_rows(&mut rng, ty, N);
        let x = normal(&mut rng, N);
        let mut w = vec![0f32; N];
        dequantize(ty, &row, &mut w).unwrap();
        let (mut exact, mut magnitude) = (0f64, 0f64);
        for (&w, &x) in w.iter().zip(&x) {
            exact += w as f64 * x as f64;
            magnitude += (w as f64 * x as f64).abs();
        }
        let fused = dot_row(ty, &row, &x).unwrap() as f64;
        // f32 accumulation: well within n·ε of the sum of magnitudes.
        let bound = 64.0 * f32::EPSILON as f64 * magnitude;
        assert!(
            (fused - exact).abs() <= bound,
            "seed {seed}: {ty} dot_row {fused}, exact {exact}, bound {bound}"
        );
    }
}

#[test]
fn dot_row_of_several_rows_is_row_by_row() {
    // A matrix-vector product slices a tensor into rows; each row is whole blocks.
    let mut rng = StdRng::seed_from_u64(seed());
    let (rows, cols) = (3, 2 * QK_K);
    let ty = GgmlType::Q4_K;
    let m = random_rows(&mut rng, ty, rows * cols);
    let x = normal(&mut rng, cols);
    let row_bytes = quantized_size(ty, cols).unwrap();
    let mut w = vec![0f32; cols];
    for r in m.chunks_exact(row_bytes) {
        dequantize(ty, r, &mut w).unwrap();
        let plain: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
        let fused = dot_row(ty, r, &x).unwrap();
        assert!(
            (plain - fused).abs() <= 1e-4 * (1.0 + plain.abs()),
            "{plain} vs {fused}"
        );
    }
}

#[test]
fn wrong_lengths_are_clear_errors() {
    let ty = GgmlType::Q4_0;
    let mut out = vec![0f32; 64];
    let err = dequantize(ty, &[0u8; 35], &mut out).unwrap_err();
    assert_eq!(
        err,
        QuantError::ByteLength {
            ty,
            n_elements: 64,
            expected: 36,
            found: 35
        }
    );
    assert_eq!(
        err.to_string(),
        "Q4_0: 64 elements take 36 bytes, but the quantized buffer has 35"
    );

    let err = dequantize(ty, &[0u8; 18], &mut out[..31]).unwrap_err();
    assert!(matches!(
        err,
        QuantError::PartialBlock {
            n_elements: 31,
            block_size: 32,
            ..
        }
    ));
    assert!(err
        .to_string()
        .contains("not a whole number of 32-element blocks"));

    let mut q = vec![0u8; 17];
    let err = quantize(ty, &[0.0; 32], &mut q).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::ByteLength {
                expected: 18,
                found: 17,
                ..
            }
        ),
        "{err}"
    );

    let err = dot_row(GgmlType::Q4_K, &[0u8; 144], &[0.0; 255]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Q4_K: the row holds 256 elements, but the vector has 255"
    );
    let err = dot_row(GgmlType::Q4_K, &[0u8; 145], &[0.0; 256]).unwrap_err();
    assert!(matches!(err, QuantError::ByteLength { .. }), "{err}");
}

#[test]
fn unsupported_types_are_named_in_the_error() {
    let err = dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut [0f32; 256]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "dequantization is not supported for tensor type IQ2_XXS"
    );
    let err = quantize(GgmlType::IQ4_NL, &[0.0; 32], &mut [0u8; 18]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "quantization is not supported for tensor type IQ4_NL"
    );
    assert!(dot_row(GgmlType::I8, &[0u8; 4], &[0.0; 4]).is_err());
}

#[test]
fn quantized_size_follows_block_geometry() {
    assert_eq!(quantized_size(GgmlType::Q4_K, 512), Ok(288));
    assert_eq!(quantized_size(GgmlType::Q8_0, 64), Ok(68));
    assert_eq!(quantized_size(GgmlType::MXFP4, 32), Ok(17));
    assert_eq!(quantized_size(GgmlType::BF16, 3), Ok(6));
    assert_eq!(quantized_size(GgmlType::F32, 0), Ok(0));
    assert!(matches!(
        quantized_size(GgmlType::Q6_K, 300),
        Err(QuantError::PartialBlock { .. })
    ));
    assert!(matches!(
        quantized_size(GgmlType::F32, usize::MAX),
        Err(QuantError::Overflow { .. })
    ));
}

#[test]
fn empty_input_is_fine() {
    for &ty in crate::types::ALL.iter().filter(|&&t| can_quantize(t)) {
        quantize(ty, &[], &mut []).unwrap();
        dequantize(ty, &[], &mut []).unwrap();
        assert_eq!(dot_row(ty, &[], &[]).unwrap(), 0.0);
    }
}
