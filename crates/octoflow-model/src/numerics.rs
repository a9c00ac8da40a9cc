//! Which roundings the CPU reference performs: exact f32 math (the default, the readable
//! specification the GPU kernels are checked against), or the roundings of llama.cpp's CPU
//! backend (ggml-cpu), to reproduce its outputs closely enough for token-level agreement.
//!
//! # What llama.cpp's CPU backend rounds, and where (`Numerics::Ggml`)
//! - **Matrix products with quantized weights** (`ggml_compute_forward_mul_mat`): each
//!   activation row is first converted to the weight type's `vec_dot_type`, then dotted with
//!   integer block kernels ([`crate::ggml_matmul`]):
//!   - Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 weights: activations quantized to Q8_0 (32-blocks,
//!     `d = absmax / 127` stored as f16, codes rounded to nearest);
//!   - Q4_1, Q5_1: Q8_1 (as Q8_0, plus `s = d * sum(codes)` stored as f16, which the kernel
//!     uses for the weight block's offset term `m * s`);
//!   - K-quants (Q2_K..Q6_K): Q8_K (256-blocks, f32 `d = -max / 127` with the sign of the
//!     largest-magnitude value, sums of 16 codes in `bsums` for the min terms);
//!   - F16 weights: activations rounded to f16; BF16: to bf16; F32: none.
//! - **KV cache**: K and V are stored as f16 (llama.cpp's default `type_k`/`type_v`).
//! - **Attention without flash attention** (llama-cpp-python's default): `KQ = mul_mat(K, Q)`
//!   with f16 K, so Q is rounded to f16 and the dot accumulates in f32 (x86: `ggml_vec_dot_f16`
//!   widens to f32 lanes); the softmax (`soft_max_ext`: scale, mask, max, `exp`, sum in
//!   double) is f32; `KQV = mul_mat(Vᵀ, softmax)` with f16 V rounds the probabilities to f16.
//! - **GELU** (`ggml_vec_gelu_f32`/`ggml_vec_geglu_f32`, built with `GGML_GELU_FP16`): the
//!   input is rounded to f16 and looked up in a table of f16 results (`x <= -10` gives 0,
//!   `x >= 10` gives `x`).
//! - **RoPE** (`ggml_rope_cache_init`): the angle of pair `i` is built by repeated f32
//!   multiplication, `theta_0 = pos`, `theta_{i+1} = theta_i * base^(-2/n_rot)` (f32 `powf`),
//!   instead of `pos * base^(-2i/n_rot)` in f64.
//! - Everything else (embeddings `get_rows`, rms_norm, softmax, SiLU, residual adds, biases)
//!   is f32 in both, up to summation order.
//!
//! Not emulated: the float summation order of the SIMD kernels (a relative 1e-6 effect), the
//! tie rule of x86's activation quantizer (round-half-even on `x * (127 / max)` where ggml's
//! reference quantizer, which we use, rounds half away from zero on `x * (1 / (max / 127))`:
//! the codes differ only where `x * id` lies within an ulp of a half), and the f16
//! accumulation of `ggml_vec_dot_f16` on ARM CPUs with FP16 vector arithmetic.

use crate::plan::Yarn;

/// How the CPU reference rounds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Numerics {
    /// Plain f32 math over dequantized weights: the specification.
    #[default]
    Exact,
    /// The roundings of llama.cpp's CPU backend: quantized activations in matrix products,
    /// f16 KV cache and attention operands, f16 GELU table, f32 RoPE angle recurrence.
    Ggml,
}

/// `v` rounded to the nearest f16 (ties to even), as f32 (ggml's `GGML_FP32_TO_FP16`).
#[inline]
pub fn round_f16(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// Rounds every element of `x` to f16 in place.
pub fn round_f16_slice(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = round_f16(*v));
}

/// ggml's f32 GELU formula (`ggml_gelu_f32`), the one its f16 table is filled with.
fn gelu_f32(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// GELU as ggml-cpu computes it for f32 tensors: 0 for `x <= -10`, `x` for `x >= 10`, else
/// the f16 table entry of `f16(x)`, i.e. `f16(gelu(f16(x)))`.
pub fn gelu_ggml(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        round_f16(gelu_f32(round_f16(x)))
    }
}

/// The RoPE `(cos, sin)` of one position as `ggml_rope_cache_init` computes them (no YaRN):
/// `theta` starts at `pos` and is multiplied by `base^(-2/n_rot)` (f32) after each pair; pair
/// `i` uses `scale * theta_i / factor_i`.
pub fn rope_angles_ggml(
    pos: usize,
    n_rot: usize,
    base: f32,
    scale: f32,
    freq_factors: Option<&[f32]>,
) -> Vec<(f32, f32)> {
    rope_angles_ggml_yarn(pos, n_rot, base, scale, freq_factors, None)
}

/// [`rope_angles_ggml`] with YaRN's terms as `rope_yarn` applies them in f32.
pub fn rope_angles_ggml_yarn(
    pos: usize,
    n_rot: usize,
    base: f32,
    scale: f32,
    freq_factors: Option<&[f32]>,
    yarn: Option<&Yarn>,
) -> Vec<(f32, f32)> {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    (0..n_rot / 2)
        .map(|i| {
            let ff = freq_factors.map_or(1.0, |f| f[i]);
            let extrap = theta / ff;
            let interp = scale * extrap;
            theta *= theta_scale;
            match yarn {
                None => (interp.cos(), interp.sin()),
                Some(y) => {
                    let mix = y.mix(i);
                    let t = interp * (1.0 - mix) + extrap * mix;
                    (t.cos() * y.mscale, t.sin() * y.mscale)
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{gelu_tanh, rope_angles};

    #[test]
    fn gelu_ggml_is_the_f16_rounded_gelu_and_saturates() {
        for i in -1200..1200 {
            let x = i as f32 * 0.01 + 0.003;
            let (got, want) = (gelu_ggml(x), gelu_tanh(x));
            if x <= -10.0 {
                assert_eq!(got, 0.0);
            } else if x >= 10.0 {
                assert_eq!(got, x);
            } else {
                // two f16 roundings (input and output), each at most 2^-11 relative, and
                // gelu's slope is at most ~1.13
                assert!(
                    (got - want).abs() <= 2e-3 * want.abs() + 2e-3 * x.abs() + 1e-6,
                    "gelu({x}): {got} vs {want}"
                );
                assert_eq!(round_f16(got), got, "gelu({x}) is an f16 value");
            }
        }
    }

    #[test]
    fn ggml_rope_angles_match_the_exact_ones_to_f32_drift() {
        for pos in [0, 1, 7, 100, 1000] {
            let exact = rope_angles(pos, 64, 10000.0, 1.0, None);
            let ggml = rope_angles_ggml(pos, 64, 10000.0, 1.0, None);
            for (i, (a, b)) in exact.iter().zip(&ggml).enumerate() {
                // theta drifts by ~i f32 roundings relative to itself
                let tol = 1e-6 * (pos as f32 + 1.0) * (i as f32 + 1.0);
                assert!(
                    (a.0 - b.0).abs() <= tol && (a.1 - b.1).abs() <= tol,
                    "pos {pos} pair {i}"
                );
            }
        }
    }
}
