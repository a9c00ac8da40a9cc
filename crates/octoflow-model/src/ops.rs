//! The element-wise and per-vector building blocks of the forward pass, in plain f32 loops.
//! Each is the CPU reference that a GPU kernel of the same name is tested against.

use crate::config::RopeType;
use crate::plan::Yarn;

/// RMSNorm of one vector in place: `x[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]`.
///
/// The sum of squares is accumulated in f64 so the reference does not drift with width.
pub fn rmsnorm(x: &mut [f32], w: &[f32], eps: f32) {
    debug_assert_eq!(x.len(), w.len());
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = (1.0 / (ss / x.len() as f64 + f64::from(eps)).sqrt()) as f32;
    for (v, &g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// RMSNorm of every `w.len()`-wide row of `x` (`[rows, w.len()]`, row-major) in place.
pub fn rmsnorm_rows(x: &mut [f32], w: &[f32], eps: f32) {
    debug_assert_eq!(x.len() % w.len(), 0);
    for row in x.chunks_exact_mut(w.len()) {
        rmsnorm(row, w, eps);
    }
}

/// Softmax of `x` in place (max-subtracted, so large logits do not overflow).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `x * sigmoid(x)`.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// Adds `bias` (`[width]`) to every row of `x` (`[rows, width]`).
pub fn add_bias_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// `a[i] += b[i]`.
pub fn add_in_place(a: &mut [f32], b: &[f32]) {
    debug_assert_eq!(a.len(), b.len());
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// The RoPE rotation angles of one position: `(cos, sin)` of
/// `theta_i = pos * scale * base^(-2i / n_rot) / factor_i` for `i < n_rot / 2`
/// (llama.cpp's `rope_yarn` without the YaRN terms; `factor_i` from `rope_freqs`, else 1).
pub fn rope_angles(
    pos: usize,
    n_rot: usize,
    base: f32,
    scale: f32,
    freq_factors: Option<&[f32]>,
) -> Vec<(f32, f32)> {
    rope_angles_yarn(pos, n_rot, base, scale, freq_factors, None)
}

/// [`rope_angles`] with YaRN's terms: pair `i`'s angle is the scaled one blended with the
/// unscaled one by `yarn.mix(i)`, and cos and sin are multiplied by `yarn.mscale`.
pub fn rope_angles_yarn(
    pos: usize,
    n_rot: usize,
    base: f32,
    scale: f32,
    freq_factors: Option<&[f32]>,
    yarn: Option<&Yarn>,
) -> Vec<(f32, f32)> {
    let m = f64::from(yarn.map_or(1.0, |y| y.mscale));
    rope_freqs(n_rot, base, scale, freq_factors, yarn)
        .into_iter()
        .map(|f| {
            let theta = pos as f64 * f;
            ((theta.cos() * m) as f32, (theta.sin() * m) as f32)
        })
        .collect()
}

/// Each rotated pair's angle per position, in radians (f64), `i < n_rot / 2`:
/// `base^(-2i / n_rot) / factor_i` times `scale`, or with YaRN times the blend
/// `scale * (1 - mix_i) + mix_i` of the scaled and unscaled angle (`yarn.mix(i)`, llama.cpp's
/// `rope_yarn`). The one place this math lives: [`rope_angles_yarn`] multiplies it by the
/// position, and the GPU's RoPE kernels take it as their frequency table.
pub fn rope_freqs(
    n_rot: usize,
    base: f32,
    scale: f32,
    freq_factors: Option<&[f32]>,
    yarn: Option<&Yarn>,
) -> Vec<f64> {
    (0..n_rot / 2)
        .map(|i| {
            let inv_freq = f64::from(base).powf(-2.0 * i as f64 / n_rot as f64);
            let extrap = inv_freq / freq_factors.map_or(1.0, |f| f64::from(f[i]));
            let blend = match yarn {
                None => f64::from(scale),
                Some(y) => {
                    let mix = f64::from(y.mix(i));
                    f64::from(scale) * (1.0 - mix) + mix
                }
            };
            extrap * blend
        })
        .collect()
}

/// Rotates the first `2 * angles.len()` dimensions of one head in place.
///
/// `Normal` rotates pairs `(2i, 2i+1)`; `Neox` rotates pairs `(i, i + n_rot/2)`. Dimensions past
/// `n_rot` pass through (partial rotary).
pub fn rope(head: &mut [f32], angles: &[(f32, f32)], kind: RopeType) {
    let half = angles.len();
    for (i, &(cos, sin)) in angles.iter().enumerate() {
        let (a, b) = match kind {
            RopeType::Normal => (2 * i, 2 * i + 1),
            RopeType::Neox => (i, i + half),
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos - x1 * sin;
        head[b] = x0 * sin + x1 * cos;
    }
}

/// Index and value of the largest element (the first one on ties); `None` for an empty slice.
pub fn argmax(x: &[f32]) -> Option<(usize, f32)> {
    x.iter()
        .copied()
        .enumerate()
        .fold(None, |best, (i, v)| match best {
            Some((_, bv)) if bv >= v => best,
            _ => Some((i, v)),
        })
}

/// `log(sum(exp(x)))`, computed in f64 around the maximum.
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{random_vec, rng};

    fn close(a: f32, b: f32, tol: f32) -> bool {
        (a - b).abs() <= tol * (1.0 + b.abs())
    }

    #[test]
    fn rmsnorm_divides_by_root_mean_square_and_scales_by_weight() {
        let mut r = rng("rmsnorm");
        let x = random_vec(&mut r, 37);
        let w = random_vec(&mut r, 37);
        let mean_sq: f32 = x.iter().map(|v| v * v).sum::<f32>() / 37.0;
        let mut y = x.clone();
        rmsnorm(&mut y, &w, 1e-5);
        for i in 0..37 {
            let want = x[i] / (mean_sq + 1e-5).sqrt() * w[i];
            assert!(close(y[i], want, 1e-5), "{i}: {} vs {want}", y[i]);
        }
    }

    #[test]
    fn softmax_is_normalized_shift_invariant_and_safe_for_large_logits() {
        let mut r = rng("softmax");
        let x = random_vec(&mut r, 20);
        let mut p = x.clone();
        softmax(&mut p);
        let z: f32 = x.iter().map(|v| v.exp()).sum();
        for (pi, xi) in p.iter().zip(&x) {
            assert!(close(*pi, xi.exp() / z, 1e-6));
        }
        let mut shifted: Vec<f32> = x.iter().map(|v| v + 1000.0).collect();
        softmax(&mut shifted);
        for (a, b) in shifted.iter().zip(&p) {
            assert!(close(*a, *b, 1e-5), "softmax overflowed or drifted");
        }
    }

    #[test]
    fn activations_match_their_formulas() {
        for x in [-3.0f32, -0.5, 0.0, 0.7, 4.0] {
            assert!(close(silu(x), x / (1.0 + (-x).exp()), 1e-6));
            let t = ((2.0f32 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh();
            assert!(close(gelu_tanh(x), 0.5 * x * (1.0 + t), 1e-6));
        }
        // GELU-tanh of 1 is 0.841192 (tabulated)
        assert!(close(gelu_tanh(1.0), 0.841_192, 1e-5));
    }

    #[test]
    fn rope_normal_rotates_adjacent_pairs_and_neox_rotates_halves() {
        let mut r = rng("rope_layouts");
        let (n_rot, pos, base) = (8, 5, 10_000.0f32);
        let x = random_vec(&mut r, 10); // 2 dims past n_rot pass through
        let angles = rope_angles(pos, n_rot, base, 1.0, None);
        let theta = |i: usize| pos as f32 * base.powf(-2.0 * i as f32 / n_rot as f32);
        for kind in [RopeType::Normal, RopeType::Neox] {
            let mut y = x.clone();
            rope(&mut y, &angles, kind);
            for i in 0..n_rot / 2 {
                let (a, b) = match kind {
                    RopeType::Normal => (2 * i, 2 * i + 1),
                    RopeType::Neox => (i, i + n_rot / 2),
                };
                let (c, s) = (theta(i).cos(), theta(i).sin());
                assert!(close(y[a], x[a] * c - x[b] * s, 1e-5), "{kind:?} {i}");
                assert!(close(y[b], x[a] * s + x[b] * c, 1e-5), "{kind:?} {i}");
            }
            assert_eq!(&y[8..], &x[8..], "dims past n_rot must pass through");
        }
    }

    #[test]
    fn rope_scores_depend_only_on_relative_position() {
        let mut r = rng("rope_relative");
        let (q, k) = (random_vec(&mut r, 16), random_vec(&mut r, 16));
        let score = |m: usize, n: usize| {
            let (mut a, mut b) = (q.clone(), k.clone());
            rope(
                &mut a,
                &rope_angles(m, 16, 10_000.0, 1.0, None),
                RopeType::Neox,
            );
            rope(
                &mut b,
                &rope_angles(n, 16, 10_000.0, 1.0, None),
                RopeType::Neox,
            );
            a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        };
        assert!(close(score(7, 3), score(104, 100), 1e-4));
        // linear scaling by 1/2 makes position 2p look like position p
        let mut a = q.clone();
        let mut b = q.clone();
        rope(
            &mut a,
            &rope_angles(10, 16, 10_000.0, 0.5, None),
            RopeType::Neox,
        );
        rope(
            &mut b,
            &rope_angles(5, 16, 10_000.0, 1.0, None),
            RopeType::Neox,
        );
        for (x, y) in a.iter().zip(&b) {
            assert!(close(*x, *y, 1e-5));
        }
    }

    #[test]
    fn argmax_and_log_sum_exp() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), Some((1, 3.0)));
        assert_eq!(argmax(&[]), None);
        let x = [0.5f32, -1.0, 2.0];
        let want = x.iter().map(|v| (*v as f64).exp()).sum::<f64>().ln();
        assert!((log_sum_exp(&x) - want).abs() < 1e-12);
    }
}
