//! Causal multi-head attention with grouped KV heads and an optional sliding window.

use rayon::prelude::*;

use crate::numerics::{round_f16_slice, Numerics};
use crate::ops::softmax;

/// The head geometry of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Width of a query/key head.
    pub head_dim: usize,
    /// Width of a value head.
    pub head_dim_v: usize,
    /// `Some(w)`: position `p` sees positions `j` with `p - j < w`.
    pub window: Option<usize>,
    /// Factor on `q . k` before the softmax.
    pub scale: f32,
}

/// Attention of `n_tokens` queries at positions `start_pos..start_pos + n_tokens`.
///
/// - `q`: `[n_tokens, n_head * head_dim]` (after RoPE)
/// - `keys`: `[n_pos, n_head_kv * head_dim]`, `values`: `[n_pos, n_head_kv * head_dim_v]`, for
///   positions `0..n_pos` with `n_pos >= start_pos + n_tokens`
/// - `out`: `[n_tokens, n_head * head_dim_v]`
///
/// Query head `h` reads KV head `h / (n_head / n_head_kv)`. The query at position `p` attends to
/// positions `j <= p` (and `p - j < window` when windowed).
pub fn attention(
    s: &AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    start_pos: usize,
    out: &mut [f32],
) {
    attention_with(s, q, keys, values, start_pos, out, Numerics::Exact, None);
}

/// [`attention`] with llama.cpp's CPU roundings when flash attention is off (its
/// `build_attn_mha`): `KQ = mul_mat(K, Q)` converts Q to f16 (K is already f16 in its cache),
/// multiplies in f32 and accumulates in f32; `soft_max_ext` scales, exponentiates and sums
/// (in double) in f32; `KQV = mul_mat(Vᵀ, KQ)` converts the probabilities to f16 and
/// accumulates in f32. `keys` and `values` must already be f16 values (the cache rounds them).
pub fn attention_ggml(
    s: &AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    start_pos: usize,
    out: &mut [f32],
) {
    attention_with(s, q, keys, values, start_pos, out, Numerics::Ggml, None);
}

/// [`attention`] (or [`attention_ggml`] under `Numerics::Ggml`) where each query head's
/// softmax also counts `exp(sinks[h])` in its denominator: a learned "attend to nothing"
/// column with no value (gpt-oss; `[n_head]`).
#[allow(clippy::too_many_arguments)]
pub fn attention_sinks(
    s: &AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    start_pos: usize,
    out: &mut [f32],
    numerics: Numerics,
    sinks: &[f32],
) {
    debug_assert_eq!(sinks.len(), s.n_head);
    attention_with(s, q, keys, values, start_pos, out, numerics, Some(sinks));
}

#[allow(clippy::too_many_arguments)]
fn attention_with(
    s: &AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    start_pos: usize,
    out: &mut [f32],
    numerics: Numerics,
    sinks: Option<&[f32]>,
) {
    let (k_dim, v_dim) = (s.n_head_kv * s.head_dim, s.n_head_kv * s.head_dim_v);
    let group = s.n_head / s.n_head_kv;
    let ggml = numerics == Numerics::Ggml;
    debug_assert_eq!(q.len() % (s.n_head * s.head_dim), 0);
    debug_assert_eq!(keys.len() / k_dim, values.len() / v_dim);
    out.par_chunks_mut(s.head_dim_v)
        .enumerate()
        .for_each(|(i, o)| {
            let (t, h) = (i / s.n_head, i % s.n_head);
            let pos = start_pos + t;
            let first = s.window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let kvh = h / group;
            let mut qh = q[(t * s.n_head + h) * s.head_dim..][..s.head_dim].to_vec();
            if ggml {
                round_f16_slice(&mut qh);
            }
            // scores over the visible positions
            let mut att: Vec<f32> = (first..=pos)
                .map(|j| {
                    let kh = &keys[j * k_dim + kvh * s.head_dim..][..s.head_dim];
                    s.scale * qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>()
                })
                .collect();
            let sink = sinks.map(|k| k[h]);
            if ggml {
                softmax_ggml(&mut att, sink);
                round_f16_slice(&mut att);
            } else {
                softmax_sink(&mut att, sink);
            }
            // weighted sum of the values
            o.fill(0.0);
            for (j, a) in (first..=pos).zip(&att) {
                let vh = &values[j * v_dim + kvh * s.head_dim_v..][..s.head_dim_v];
                for (x, v) in o.iter_mut().zip(vh) {
                    *x += a * v;
                }
            }
        });
}

/// The softmax of `x` with an optional sink logit counted in the denominator only.
fn softmax_sink(x: &mut [f32], sink: Option<f32>) {
    let Some(sink) = sink else {
        softmax(x);
        return;
    };
    let max = x.iter().copied().fold(sink, f32::max);
    let mut sum = (sink - max).exp();
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// ggml's f32 softmax (`ggml_compute_forward_soft_max_f32`): `exp(x - max)` in f32, their sum
/// in double, then a multiplication by the f32 reciprocal; a sink raises the max and adds its
/// `exp` to the sum.
fn softmax_ggml(x: &mut [f32], sink: Option<f32>) {
    let mut max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if let Some(s) = sink {
        max = max.max(s);
    }
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    if let Some(s) = sink {
        sum += f64::from((s - max).exp());
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{random_vec, rng};

    /// Attention written out with an explicit mask, one query head at a time.
    fn naive(s: &AttentionShape, q: &[f32], k: &[f32], v: &[f32], start: usize) -> Vec<f32> {
        let (hd, hv) = (s.head_dim, s.head_dim_v);
        let n_tok = q.len() / (s.n_head * hd);
        let n_pos = k.len() / (s.n_head_kv * hd);
        let mut out = vec![0f32; n_tok * s.n_head * hv];
        for t in 0..n_tok {
            let p = start + t;
            for h in 0..s.n_head {
                let g = h * s.n_head_kv / s.n_head;
                let visible = |j: usize| j <= p && s.window.is_none_or(|w| p - j < w);
                let scores: Vec<f32> = (0..n_pos)
                    .map(|j| {
                        if !visible(j) {
                            return f32::NEG_INFINITY;
                        }
                        (0..hd)
                            .map(|d| {
                                q[(t * s.n_head + h) * hd + d] * k[(j * s.n_head_kv + g) * hd + d]
                            })
                            .sum::<f32>()
                            * s.scale
                    })
                    .collect();
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let z: f32 = scores.iter().map(|x| (x - m).exp()).sum();
                for j in 0..n_pos {
                    let a = (scores[j] - m).exp() / z;
                    for d in 0..hv {
                        out[(t * s.n_head + h) * hv + d] += a * v[(j * s.n_head_kv + g) * hv + d];
                    }
                }
            }
        }
        out
    }

    fn check(window: Option<usize>, test: &str) {
        let mut r = rng(test);
        let s = AttentionShape {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 8,
            head_dim_v: 4,
            window,
            scale: 0.35,
        };
        let (start, n_tok) = (5, 4);
        let n_pos = start + n_tok;
        let q = random_vec(&mut r, n_tok * s.n_head * s.head_dim);
        let k = random_vec(&mut r, n_pos * s.n_head_kv * s.head_dim);
        let v = random_vec(&mut r, n_pos * s.n_head_kv * s.head_dim_v);
        let mut out = vec![0f32; n_tok * s.n_head * s.head_dim_v];
        attention(&s, &q, &k, &v, start, &mut out);
        for (i, (a, b)) in out.iter().zip(naive(&s, &q, &k, &v, start)).enumerate() {
            assert!((a - b).abs() < 1e-5, "{test} element {i}: {a} vs {b}");
        }
    }

    #[test]
    fn causal_gqa_attention_matches_the_masked_formula() {
        check(None, "attention_causal");
    }

    #[test]
    fn sliding_window_attention_matches_the_masked_formula() {
        check(Some(3), "attention_window");
    }

    #[test]
    fn sliding_window_hides_positions_outside_it() {
        let mut r = rng("attention_window_hides");
        let s = AttentionShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 4,
            head_dim_v: 4,
            window: Some(2),
            scale: 0.5,
        };
        let q = random_vec(&mut r, 8);
        let k = random_vec(&mut r, 4 * 4);
        let mut v = random_vec(&mut r, 4 * 4);
        let mut a = vec![0f32; 8];
        attention(&s, &q, &k, &v, 3, &mut a);
        // position 3 with window 2 sees positions 2 and 3 only
        v[..8].iter_mut().for_each(|x| *x += 100.0);
        let mut b = vec![0f32; 8];
        attention(&s, &q, &k, &v, 3, &mut b);
        assert_eq!(a, b);
    }
}
