//! The mixture-of-experts feed-forward (qwen3moe, gpt-oss) in five kernels, recorded in this
//! order by the model's graph (shaders in `shaders/moe/`):
//!
//! 1. [`MoeRoute`] (`route.rs`): per token, the `n_used` largest router logits and their
//!    weights under the plan's gating ([`MoeGating`]) → expert ids and weights per (token, slot)
//!    pair.
//! 2. [`MoeGroup`] (`group.rs`, batches only): the pairs grouped by expert — offsets and a
//!    list sorted by expert, then by pair (a stable counting sort: deterministic).
//! 3. [`MoeExperts`] (`experts.rs`): the expert products. A few tokens take a matvec that reads
//!    only the rows of each pair's expert (its id read on the device); batches a grouped matmul
//!    that reads each expert's rows once per tile of its pairs. Every GPU weight type; the GLU
//!    variants fuse gate, up, their biases and the activation ([`MoeAct`]).
//! 4. The down products: [`MoeExperts`] again, one input row per pair.
//! 5. [`MoeCombine`] (`combine.rs`): the weighted sum of each token's expert outputs, added to
//!    the residual stream.
//!
//! A few tokens (decode) take two fusions: [`MoeRouter`] (`router.rs`) does the block's norm,
//! the router product and step 1 in one dispatch, and the down products' COMBINE variant
//! ([`Combine`]) does steps 4 and 5 in one — three barrier phases a layer instead of six.
//!
//! Stacked expert tensors (GGUF's 3-D `*_exps`) are bound whole, or in pieces of whole experts
//! where one binding is too small: each piece is one dispatch that skips pairs routed elsewhere.

mod combine;
mod experts;
mod experts_dot;
#[cfg(test)]
mod experts_dot_tests;
#[cfg(test)]
mod experts_tests;
mod group;
mod route;
mod router;

pub use combine::{moe_combine_ref, MoeCombine};
pub use experts::{
    moe_experts_coop_ref, moe_experts_ref, Combine, ExpertWeights, ExpertsArgs, Groups, MoeExperts,
    COMBINE_MAX_USED,
};
pub use experts_dot::moe_experts_dot_ref;
pub use group::{moe_group_ref, MoeGroup};
pub use route::{moe_route_ref, MoeRoute, MAX_EXPERTS, MAX_USED};
pub use router::{moe_router_ref, MoeRouter, RouterArgs, RouterRef, ROUTER_MAX_TOKENS};

use octoflow_vk::Context;

use crate::error::Result;

/// How router logits become the selected experts' weights (llama.cpp's `build_moe_ffn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeGating {
    /// Softmax over the selected logits only (gpt-oss: `SOFTMAX_WEIGHT`).
    SoftmaxOfSelected,
    /// Softmax over every expert; with `norm` the selected probabilities divided by their sum
    /// (at least 2⁻¹⁴) (qwen3moe: `SOFTMAX`, `expert_weights_norm`).
    Softmax { norm: bool },
}

impl MoeGating {
    /// The shader's code (`gating` in `moe_route.comp`).
    pub(crate) fn code(self) -> u32 {
        match self {
            MoeGating::SoftmaxOfSelected => 0,
            MoeGating::Softmax { norm: false } => 1,
            MoeGating::Softmax { norm: true } => 2,
        }
    }
}

/// The activation of an expert's gate and up values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MoeAct {
    /// `silu(gate) · up` (qwen3moe).
    Silu,
    /// gpt-oss's clamped SwiGLU (llama.cpp's `swiglu_oai`): `x = min(gate, limit)`,
    /// `y = clamp(up, -limit, limit)`, `x · σ(alpha · x) · (y + 1)`.
    SwigluOai { alpha: f32, limit: f32 },
}

impl MoeAct {
    /// The shaders' op code and its two parameters (`moe_act.glsl`).
    pub(crate) fn push(self) -> (u32, f32, f32) {
        match self {
            MoeAct::Silu => (0, 0.0, 0.0),
            MoeAct::SwigluOai { alpha, limit } => (1, alpha, limit),
        }
    }

    /// CPU reference of one gate and up value.
    pub fn apply(self, gate: f32, up: f32) -> f32 {
        match self {
            MoeAct::Silu => gate / (1.0 + (-gate).exp()) * up,
            MoeAct::SwigluOai { alpha, limit } => {
                let x = gate.min(limit);
                let y = up.clamp(-limit, limit);
                x / (1.0 + (-alpha * x).exp()) * (y + 1.0)
            }
        }
    }
}

/// Every mixture-of-experts kernel of a device (the expert products' pipelines are built per
/// weight type on first use).
pub struct Moe {
    pub route: MoeRoute,
    pub router: MoeRouter,
    pub group: MoeGroup,
    pub experts: MoeExperts,
    pub combine: MoeCombine,
}

impl Moe {
    /// Builds the pipelines.
    pub fn new(ctx: &Context) -> Result<Self> {
        let t = crate::Tuning::for_device(ctx.caps());
        Ok(Moe {
            route: MoeRoute::new(ctx)?,
            router: MoeRouter::new(),
            group: MoeGroup::new(ctx)?,
            experts: {
                MoeExperts::new()
                    .with_coop(t.moe_coop)
                    .with_coop_wide(t.moe_coop_wide_min)
                    .with_coop_narrow(t.moe_coop_narrow_max)
                    .with_dot(ctx.caps(), t.moe_dot)
                    .with_dot_groups(t.moe_dot_groups)
                    .with_xq(t.moe_xq)
            },
            combine: MoeCombine::new(ctx)?,
        })
    }
}
