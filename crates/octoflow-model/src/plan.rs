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
//! ```
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
}

/// The feed-forward sub-block.
#[derive(Debug, Clone, PartialEq)]
pub enum FfnPlan {
    /// `down(act(gate(h)) * up(h))` (`ffn_gate`, `ffn_up`, `ffn_down`).
    Glu(GluPlan),
}

/// A gated feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GluPlan {
    pub act: Activation,
    /// RMSNorm of the down projection before the residual add (`post_ffw_norm`).
    pub post_norm: bool,
}

impl BlockPlan {
    /// The gated feed-forward block: every walker matches here, so a new kind of
    /// feed-forward fails to compile until each of them handles it.
    pub fn glu(&self) -> &GluPlan {
        match &self.ffn {
            FfnPlan::Glu(g) => g,
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
