//! Qwen3 (dense): the llama block with a per-head RMSNorm of Q and K before RoPE
//! (`attn_q_norm`, `attn_k_norm`), RoPE in the NeoX layout, no biases, SwiGLU. Heads are often
//! wider than `n_embd / n_head` (`attention.key_length`), which the shared hyper-parameters
//! already read. Facts from llama.cpp (`models/qwen3.cpp`, `llama-model.cpp`).

use crate::config::{Activation, BaseHParams, Recipe, RopeType};
use crate::plan::{AttnKind, AttnPlan, BlockPlan, FfnPlan, GluPlan};

pub(super) fn configure(base: &BaseHParams) -> Recipe {
    let block = BlockPlan {
        attn: attention(base),
        ffn: FfnPlan::Glu(GluPlan {
            act: Activation::Silu,
            post_norm: false,
        }),
    };
    Recipe {
        embedding_scale: 1.0,
        blocks: vec![block; base.n_layer],
    }
}

/// Qwen3's attention sub-block (qwen3moe's too).
pub(super) fn attention(base: &BaseHParams) -> AttnPlan {
    AttnPlan {
        qkv_bias: false,
        qk_norm: true,
        rope: base.rope(RopeType::Neox),
        kind: AttnKind::Full,
        scale: base.default_attention_scale(),
        scale_q: false,
        post_norm: false,
        out_bias: false,
        sinks: false,
    }
}
