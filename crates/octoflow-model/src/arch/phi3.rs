//! Phi-3 (and Phi-3.5 / Phi-4-mini, which ship as `phi3`): the llama block with the query, key
//! and value projections fused into one `attn_qkv` matrix and the gate and up projections fused
//! into one `ffn_up` of `2 * n_ff` rows (gate first), NeoX RoPE. The fused matrices are split
//! into row views at load (`weights.rs`), so every walker sees the plain llama block.
//!
//! Facts from llama.cpp (`models/phi3.cpp`, `llama-model.cpp`):
//! - `attn_qkv` is optional: files with separate `attn_q`/`attn_k`/`attn_v` load too.
//! - The feed-forward is `LLM_FFN_SWIGLU` over the fused `ffn_up` (`silu(first half) * second
//!   half`), then `ffn_down`.
//! - Q is scaled by `1/sqrt(head_dim)` before attention (the usual scale).
//! - Sliding-window attention is disabled for phi3 in llama.cpp (the converters' window is
//!   not trusted), so every layer attends fully.
//! - The 128k-context files carry LongRoPE factors (`rope_factors_long/short`), chosen by the
//!   run's context length against `rope.scaling.original_context_length`
//!   ([`crate::ModelWeights::rope_factors`]), and an attention factor
//!   (`rope.scaling.attn_factor`) that multiplies cos and sin (config.rs's `read_yarn`).

use crate::config::{Activation, BaseHParams, Meta, Recipe, RopeType};
use crate::error::Result;
use crate::plan::{AttnKind, AttnPlan, BlockPlan, FfnPlan, GluPlan};

pub(super) fn configure(_meta: &Meta, base: &BaseHParams) -> Result<Recipe> {
    let block = BlockPlan {
        attn: AttnPlan {
            qkv_bias: false,
            qk_norm: false,
            rope: base.rope(RopeType::Neox),
            kind: AttnKind::Full,
            scale: base.default_attention_scale(),
            scale_q: true,
            post_norm: false,
            out_bias: false,
            sinks: false,
        },
        ffn: FfnPlan::Glu(GluPlan {
            act: Activation::Silu,
            post_norm: false,
        }),
    };
    Ok(Recipe {
        embedding_scale: 1.0,
        blocks: vec![block; base.n_layer],
    })
}
