//! The integer block dots against direct computations over dequantized operands.

use octoflow_gguf::quant;
use octoflow_gguf::GgmlType as T;
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::testing::rng;

/// Every weight format with an integer kernel.
const TYPES: [T; 8] = [
    T::Q4_0,
    T::Q4_1,
    T::Q5_0,
    T::Q5_1,
    T::Q8_0,
    T::Q4_K,
    T::Q5_K,
    T::Q6_K,
];

/// Activation-like data: mostly small values with a few large ones, like hidden states.
fn activations(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = r.gen_range(-1.0..1.0);
            if r.gen_range(0..50) == 0 {
                v * 20.0
            } else {
                v
            }
        })
        .collect()
}

fn quantized_rows(ty: T, r: &mut StdRng, rows: usize, cols: usize) -> Vec<u8> {
    let w: Vec<f32> = (0..rows * cols).map(|_| r.gen_range(-0.1..0.1)).collect();
    let mut q = vec![0u8; quant::quantized_size(ty, w.len()).unwrap()];
    quant::quantize(ty, &w, &mut q).unwrap();
    q
}

/// The unpacked integers rebuild the dequantized weights bit for bit, with ggml's operation
/// order (`d * q + m`, `(d * sc) * q - dmin * m`).
#[test]
fn unpacked_weight_rows_rebuild_the_dequantized_values() {
    let mut r = rng("unpack_rebuilds");
    for ty in TYPES {
        let n = 512;
        let q = quantized_rows(ty, &mut r, 1, n);
        let mut want = vec![0f32; n];
        quant::dequantize(ty, &q, &mut want).unwrap();
        let mut row = IntRow::default();
        row.unpack(ty, &q);
        assert_eq!(row.codes.len(), n, "{ty}");
        for (i, &w) in want.iter().enumerate() {
            let c = f32::from(row.codes[i]);
            let got = match kind(ty).unwrap() {
                Kind::Symmetric => row.d[i / 32] * c,
                Kind::Affine => row.d[i / 32] * c + row.m[i / 32],
                Kind::K { sub, mins } => {
                    let (b, s) = (i / 256, i / sub);
                    let scaled = (row.d[b] * row.sc[s] as f32) * c;
                    if mins {
                        scaled - row.m[b] * row.mins[s] as f32
                    } else {
                        scaled
                    }
                }
            };
            assert_eq!(got, w, "{ty} element {i}");
        }
    }
}

/// The quantized activation rows dequantize to what `quant::dequantize` gives, and their
/// Q8_1 sums / Q8_K block sums are those of the codes.
#[test]
fn activation_rows_hold_the_quantizer_output() {
    let mut r = rng("activation_rows");
    let x = activations(&mut r, 512);
    for ty in [T::Q8_0, T::Q8_1, T::Q8_K] {
        let a = ActRow::quantize(ty, &x).unwrap();
        let mut bytes = vec![0u8; quant::quantized_size(ty, x.len()).unwrap()];
        quant::quantize(ty, &x, &mut bytes).unwrap();
        let mut want = vec![0f32; x.len()];
        quant::dequantize(ty, &bytes, &mut want).unwrap();
        assert_eq!(a.dequantize(), want, "{ty}");
        if ty == T::Q8_1 {
            for (b, q) in a.qs.chunks_exact(32).enumerate() {
                // `s` uses the unrounded scale `absmax / 127`, not the stored f16 `d`
                let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
                let amax = x[32 * b..32 * b + 32]
                    .iter()
                    .fold(0f32, |m, v| m.max(v.abs()));
                let s = half::f16::from_f32(sum as f32 * (amax / 127.0)).to_f32();
                assert_eq!(a.s[b], s, "Q8_1 block {b}");
            }
        }
        if ty == T::Q8_K {
            for (i, q) in a.qs.chunks_exact(16).enumerate() {
                assert_eq!(a.bsums[i], q.iter().map(|&v| i32::from(v)).sum::<i32>());
            }
        }
    }
}

/// The emulated dot equals the dot of the dequantized weights with the dequantized
/// activation codes (f64), plus, for Q4_1/Q5_1, the offset term's use of the stored f16 sum
/// `s` instead of `d * sum(codes)`.
///
/// Bound: the kernel sums per-block f32 products in f32; each step rounds by at most 2^-24
/// relative to the running magnitude, so over 32 blocks the error stays below ~4e-6 of
/// `sum |w_i x_i|` (1e-5 allows for the block scale products).
#[test]
fn integer_block_dots_match_the_dequantized_dot() {
    let mut r = rng("integer_dots");
    for ty in TYPES {
        for cols in [256, 1024] {
            let q = quantized_rows(ty, &mut r, 3, cols);
            let x = activations(&mut r, cols);
            let k = kind(ty).unwrap();
            let a = ActRow::quantize(vec_dot_type(ty), &x).unwrap();
            let xd = a.dequantize();
            let mut row = IntRow::default();
            for (ri, rb) in q.chunks_exact(q.len() / 3).enumerate() {
                row.unpack(ty, rb);
                let mut w = vec![0f32; cols];
                quant::dequantize(ty, rb, &mut w).unwrap();
                let mut want: f64 = w.iter().zip(&xd).map(|(&a, &b)| a as f64 * b as f64).sum();
                if k == Kind::Affine {
                    for b in 0..cols / 32 {
                        let codes: i32 = a.qs[32 * b..32 * b + 32]
                            .iter()
                            .map(|&v| i32::from(v))
                            .sum();
                        let exact_s = a.d[b] as f64 * codes as f64;
                        want += row.m[b] as f64 * (a.s[b] as f64 - exact_s);
                    }
                }
                let scale: f64 = w
                    .iter()
                    .zip(&xd)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let got = row.dot(k, &a) as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * scale,
                    "{ty} cols {cols} row {ri}: {got} vs {want} (scale {scale})"
                );
            }
        }
    }
}

/// The activation quantization is a real change: the emulated dot differs from the f32 dot
/// of the unquantized activations by about the Q8 step, never by more than a few percent.
#[test]
fn quantized_activations_move_the_dot_by_the_q8_step() {
    let mut r = rng("q8_step");
    for ty in TYPES {
        let cols = 1024;
        let q = quantized_rows(ty, &mut r, 1, cols);
        let x = activations(&mut r, cols);
        let mut w = vec![0f32; cols];
        quant::dequantize(ty, &q, &mut w).unwrap();
        let exact: f64 = w.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
        let mut row = IntRow::default();
        row.unpack(ty, &q);
        let got = row.dot(
            kind(ty).unwrap(),
            &ActRow::quantize(vec_dot_type(ty), &x).unwrap(),
        );
        let scale: f64 = w
            .iter()
            .zip(&x)
            .map(|(&a, &b)| (a as f64 * b as f64).abs())
            .sum();
        let diff = (got as f64 - exact).abs();
        assert!(diff > 0.0, "{ty}: activation quantization changed nothing");
        // each code moves by at most half a step of absmax/127 (absmax up to 20x the rest)
        assert!(
            diff <= 0.05 * scale,
            "{ty}: {got} vs {exact} (scale {scale})"
        );
    }
}

#[test]
fn vec_dot_types_follow_ggml() {
    assert_eq!(vec_dot_type(T::Q4_0), T::Q8_0);
    assert_eq!(vec_dot_type(T::Q5_0), T::Q8_0);
    assert_eq!(vec_dot_type(T::Q4_1), T::Q8_1);
    assert_eq!(vec_dot_type(T::Q4_K), T::Q8_K);
    assert_eq!(vec_dot_type(T::Q6_K), T::Q8_K);
    assert_eq!(vec_dot_type(T::F16), T::F16);
    assert_eq!(vec_dot_type(T::F32), T::F32);
    let mut x = vec![0.1f32, 1.0 / 3.0];
    round_to_vec_dot_type(T::F16, &mut x).unwrap();
    assert_eq!(
        x,
        [
            half::f16::from_f32(0.1).to_f32(),
            half::f16::from_f32(1.0 / 3.0).to_f32()
        ]
    );
}
