//! The block plan: what one transformer block computes, described once per layer by the
//! architecture file (`arch/`) and walked by every forward — the CPU reference (`forward.rs`),
//! the GPU graph (`gpu/graph.rs`), the training step and its f64 reference (`octoflow-train`).
//!
//! A block is two residual sub-blocks, each `x += post_norm?(sub(rms_norm(x)))`:
//! ```text
//! attention:    q, k, v = proj(h) (+ bias)       qkv_bias
//!               q, k = rms_norm per head         qk_norm
//!               q, k = rope(q, k)                rope: kind, base, scale
//!               a = softmax(q kᵀ · scale) v      kind: full / sliding window
//!               a = proj(a) → post_norm?         post_norm
//! feed-forward: Glu: down(act(gate(h)) * up(h)) → post_norm?
//!               Moe: route h to the top experts, Σ weight_e · down_e(act(gate_e(h), up_e(h)))
//! ```
//! Attention may also carry an output bias and learned per-head sink logits (gpt-oss), and
//! RoPE the YaRN terms.
//! The plan is data, not code: a family with these pieces is one `arch/` file. A new piece
//! (say, a mixture-of-experts feed-forward) is a new variant here, and because every walker
//! matches on these types the compiler lists each place that must learn it.

use crate::config::{Activation, RopeType};
use crate::error::{ModelError, Result};

/// One layer's block.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockPlan {
    pub attn: AttnPlan,
    pub ffn: FfnPlan,
}

/// The attention sub-block.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnPlan {
    /// Q, K, V projections carry biases (`attn_q.bias`, ...), which must be present.
    pub qkv_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    pub rope: RopePlan,
    pub kind: AttnKind,
    /// Factor applied to `q · k` before the softmax.
    pub scale: f32,
    /// The graph multiplies Q by `scale` before attention instead of scaling the scores
    /// (llama.cpp's phi3): the same math, but under llama.cpp's roundings (f16 attention
    /// operands, `Numerics::Ggml`) Q is rounded after the scale, so the oracle does the same.
    pub scale_q: bool,
    /// RMSNorm of the output projection before the residual add (`post_attention_norm`).
    pub post_norm: bool,
    /// The output projection carries a bias (`attn_output.bias`, gpt-oss).
    pub out_bias: bool,
    /// Learned per-head sink logits (`attn_sinks.weight`, `[n_head]`, gpt-oss): each softmax
    /// over a query's scores also counts `exp(sink)` in its denominator, a column with no
    /// value (llama.cpp's `soft_max_ext` with sinks).
    pub sinks: bool,
}

/// Which keys a query sees (always causal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Every earlier position.
    Full,
    /// A query at position `p` sees keys at positions `j` with `p - j < w` (llama.cpp's
    /// standard SWA).
    SlidingWindow(usize),
}

impl AttnKind {
    /// The window, if any.
    pub fn window(self) -> Option<usize> {
        match self {
            Self::Full => None,
            Self::SlidingWindow(w) => Some(w),
        }
    }
}

/// Rotary position embedding of this layer's Q and K.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopePlan {
    pub kind: RopeType,
    /// Base frequency `theta`.
    pub base: f32,
    /// Position scale (linear scaling: `1 / factor`; 1.0 without scaling).
    pub scale: f32,
    /// YaRN's frequency-dependent blend and magnitude scale (`rope.scaling.type = yarn`).
    pub yarn: Option<Yarn>,
}

/// YaRN (llama.cpp's `rope_yarn`): per frequency pair `i`, the angle blends the scaled
/// (interpolated) and unscaled (extrapolated) angle by a ramp over the correction dimensions,
/// and cos/sin are multiplied by `mscale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// Weight of the extrapolated angle where the ramp is 1 (`yarn_ext_factor`; 1.0).
    pub ext_factor: f32,
    /// The correction dimensions: pairs below `low` keep the unscaled angle, pairs past
    /// `high` the scaled one (`ggml_rope_yarn_corr_dims`).
    pub low: f32,
    pub high: f32,
    /// Factor on cos and sin: the attention factor times `1 + 0.1 ln(factor)`.
    pub mscale: f32,
}

impl Yarn {
    /// YaRN for `n_rot` rotary dimensions, RoPE base `base`, scaling `factor` (> 1), a
    /// training context of `n_ctx_orig`, llama.cpp's `beta_fast`/`beta_slow` and the file's
    /// `rope.scaling.attn_factor` (1.0 when absent); `truncate` rounds the correction
    /// dimensions outwards to whole pairs (llama.cpp always does; transformers unless the
    /// config says `truncate: false`).
    pub fn new(
        n_rot: usize,
        base: f32,
        factor: f32,
        n_ctx_orig: usize,
        beta: (f32, f32),
        attn_factor: f32,
        truncate: bool,
    ) -> Self {
        // the dimension where a frequency makes `beta` turns over the original context
        let dim = |b: f32| {
            n_rot as f32 * (n_ctx_orig as f32 / (b * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let (low, high) = if truncate {
            (dim(beta.0).floor(), dim(beta.1).ceil())
        } else {
            (dim(beta.0), dim(beta.1))
        };
        let (low, high) = (low.max(0.0), high.min(n_rot as f32 - 1.0));
        // llama.cpp's `get_mscale(factor) / (1 + 0.1 ln factor)` (context setup), times the
        // `1 + 0.1 ln factor` that `rope_yarn` applies
        let grow = 1.0 + 0.1 * factor.ln();
        let get = if factor <= 1.0 { 1.0 } else { grow };
        Yarn {
            ext_factor: 1.0,
            low,
            high,
            mscale: get / grow * attn_factor * grow,
        }
    }

    /// How much of pair `i`'s angle is the unscaled one (`rope_yarn_ramp(low, high, 2i)`
    /// times the extrapolation factor).
    pub fn mix(&self, i: usize) -> f32 {
        let y = (i as f32 - self.low) / (self.high - self.low).max(0.001);
        (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor
    }
}

/// The feed-forward sub-block.
#[derive(Debug, Clone, PartialEq)]
pub enum FfnPlan {
    /// `down(act(gate(h)) * up(h))` (`ffn_gate`, `ffn_up`, `ffn_down`).
    Glu(GluPlan),
    /// A mixture of experts (`ffn_gate_inp` routes, `ffn_{gate,up,down}_exps` per expert).
    Moe(MoePlan),
}

/// A mixture-of-experts feed-forward block: a router picks `n_used` of `n_expert` experts per
/// token, each a gated feed-forward of its own, and the block returns their weighted sum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoePlan {
    pub n_expert: usize,
    pub n_used: usize,
    /// Rows of each expert's gate and up matrices.
    pub n_ff: usize,
    pub gating: Gating,
    pub act: MoeAct,
    /// The router and every expert's products carry biases (`*.bias`, gpt-oss).
    pub biases: bool,
    /// Factor on the selected experts' weights (`expert_weights_scale`; 1.0 when absent).
    pub weights_scale: f32,
}

/// How router logits become the selected experts' weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gating {
    /// Select the top logits, then softmax over the selected ones only (gpt-oss,
    /// llama.cpp's `SOFTMAX_WEIGHT`).
    SoftmaxOfSelected,
    /// Softmax over every expert, select the top, and with `norm` divide the selected
    /// weights by their sum (at least 2⁻¹⁴, llama.cpp's clamp) (qwen3moe: `SOFTMAX`,
    /// `expert_weights_norm`).
    Softmax { norm: bool },
}

impl Gating {
    /// The weights of the `selected` experts (in selection order) from all of a token's
    /// router logits.
    pub fn weights(self, logits: &[f32], selected: &[usize]) -> Vec<f32> {
        match self {
            Gating::SoftmaxOfSelected => {
                let mut w: Vec<f32> = selected.iter().map(|&e| logits[e]).collect();
                crate::ops::softmax(&mut w);
                w
            }
            Gating::Softmax { norm } => {
                let mut p = logits.to_vec();
                crate::ops::softmax(&mut p);
                let mut w: Vec<f32> = selected.iter().map(|&e| p[e]).collect();
                if norm {
                    let sum = w.iter().sum::<f32>().max(6.103_515_6e-5);
                    w.iter_mut().for_each(|v| *v /= sum);
                }
                w
            }
        }
    }
}

/// The activation of an expert's gate and up products.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MoeAct {
    /// gpt-oss's clamped SwiGLU: `x = min(gate, limit)`, `y = clamp(up, -limit, limit)`,
    /// `x · σ(alpha · x) · (y + 1)` (llama.cpp's `swiglu_oai`).
    SwigluOai { alpha: f32, limit: f32 },
    /// `silu(gate) · up` (qwen3moe).
    Silu,
}

impl MoeAct {
    /// The activation of one gate and up value.
    pub fn apply(self, gate: f32, up: f32) -> f32 {
        match self {
            MoeAct::SwigluOai { alpha, limit } => {
                let x = gate.min(limit);
                let y = up.clamp(-limit, limit);
                x / (1.0 + (-alpha * x).exp()) * (y + 1.0)
            }
            MoeAct::Silu => gate / (1.0 + (-gate).exp()) * up,
        }
    }
}

/// A gated feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GluPlan {
    pub act: Activation,
    /// RMSNorm of the down projection before the residual add (`post_ffw_norm`).
    pub post_norm: bool,
}

impl BlockPlan {
    /// The gated feed-forward block, for walkers that run only that kind (the GPU graph and
    /// training refuse a model with another kind at load, through [`BlockPlan::gpu_missing`]).
    pub fn glu(&self) -> Result<&GluPlan> {
        match &self.ffn {
            FfnPlan::Glu(g) => Ok(g),
            FfnPlan::Moe(_) => Err(ModelError::Unsupported(
                "this path does not run a mixture-of-experts feed-forward yet".into(),
            )),
        }
    }

    /// Why the training step (and its f64 reference) cannot run this block yet, if it cannot:
    /// a mixture-of-experts feed-forward, and gpt-oss's attention pieces, which the inference
    /// graph runs but the training step's forward and backward do not.
    pub fn train_missing(&self) -> Option<&'static str> {
        if matches!(self.ffn, FfnPlan::Moe(_)) {
            Some("a mixture-of-experts feed-forward")
        } else if self.attn.sinks {
            Some("attention sinks")
        } else if self.attn.out_bias {
            Some("an attention output bias")
        } else if self.attn.rope.yarn.is_some() {
            Some("YaRN RoPE scaling")
        } else {
            None
        }
    }
}

/// The tensor of layer `il` named `name` that a step of the plan calls for (`on`): `None` when
/// the plan has no such step. Weights are loaded from the plan, so a missing tensor the plan
/// calls for means weights and plan disagree — an error, not a silent skip.
pub fn planned<'a, T>(il: usize, on: bool, w: &'a Option<T>, name: &str) -> Result<Option<&'a T>> {
    match (on, w) {
        (false, _) => Ok(None),
        (true, Some(w)) => Ok(Some(w)),
        (true, None) => Err(ModelError::PlanWithoutTensor {
            name: format!("blk.{il}.{name}.weight"),
        }),
    }
}

/// [`planned`] for a bias: the tensor `blk.{il}.{name}.bias`.
pub fn planned_bias<'a, T>(
    il: usize,
    on: bool,
    w: &'a Option<T>,
    name: &str,
) -> Result<Option<&'a T>> {
    match (on, w) {
        (false, _) => Ok(None),
        (true, Some(w)) => Ok(Some(w)),
        (true, None) => Err(ModelError::PlanWithoutTensor {
            name: format!("blk.{il}.{name}.bias"),
        }),
    }
}

/// The per-head norms of Q and K (`attn_q_norm`, `attn_k_norm`) where the plan has them.
pub fn qk_norms<'a, T>(
    il: usize,
    plan: &AttnPlan,
    q: &'a Option<T>,
    k: &'a Option<T>,
) -> Result<Option<(&'a T, &'a T)>> {
    let q = planned(il, plan.qk_norm, q, "attn_q_norm")?;
    Ok(q.zip(planned(il, plan.qk_norm, k, "attn_k_norm")?))
}
