//! Qwen3-MoE: the qwen3 attention (per-head Q/K norms, NeoX RoPE, no biases) with a
//! mixture-of-experts feed-forward.
//!
//! Facts from llama.cpp (`models/qwen3moe.cpp`, `llama-graph.cpp`'s `build_moe_ffn`):
//! - Routing: softmax over every expert's router logit (`SOFTMAX`), the `expert_used_count`
//!   largest selected, their weights divided by their sum (`norm_w = true`), times
//!   `expert_weights_scale` where set.
//! - Each expert: `down(silu(gate h) · up h)`, no biases.
//! - An expert's width is `expert_feed_forward_length`, else `feed_forward_length /
//!   expert_used_count`.

use crate::config::{BaseHParams, Meta, Recipe};
use crate::error::Result;
use crate::plan::{BlockPlan, FfnPlan, Gating, MoeAct, MoePlan};

pub(super) fn configure(meta: &Meta, base: &BaseHParams) -> Result<Recipe> {
    let n_expert = meta.req_usize("expert_count")?;
    let n_used = meta.req_usize("expert_used_count")?;
    if n_expert == 0 || n_used == 0 || n_used > n_expert {
        return Err(meta.bad(
            "expert_used_count",
            &format!("must be between 1 and expert_count ({n_expert}), found {n_used}"),
        ));
    }
    let n_ff = meta
        .opt_usize("expert_feed_forward_length")?
        .unwrap_or(base.n_ff / n_used);
    let block = BlockPlan {
        attn: super::qwen3::attention(base),
        ffn: FfnPlan::Moe(MoePlan {
            n_expert,
            n_used,
            n_ff,
            gating: Gating::Softmax { norm: true },
            act: MoeAct::Silu,
            biases: false,
            weights_scale: super::expert_weights_scale(meta)?,
        }),
    };
    Ok(Recipe {
        embedding_scale: 1.0,
        blocks: vec![block; base.n_layer],
    })
}
