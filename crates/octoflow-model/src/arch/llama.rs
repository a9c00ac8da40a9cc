//! Llama (and SmolLM2, which ships as `llama`): pre-norm blocks, SwiGLU feed-forward, RoPE on
//! adjacent pairs. llama.cpp's converter permutes the Q/K rows of HF checkpoints so that the
//! adjacent-pair rotation here equals HF's rotate-half.

use crate::config::{Activation, BaseHParams, Meta, Recipe, RopeType};
use crate::error::Result;
use crate::plan::{AttnKind, AttnPlan, BlockPlan, FfnPlan, GluPlan};

pub(super) fn configure(meta: &Meta, base: &BaseHParams) -> Result<Recipe> {
    // Some llama-family files store an explicit scale (`attention.scale`); 0 or absent means
    // the usual 1/sqrt(head_dim), as in llama.cpp.
    let attention_scale = meta
        .opt_f32("attention.scale")?
        .filter(|s| *s != 0.0)
        .unwrap_or_else(|| base.default_attention_scale());
    let block = BlockPlan {
        attn: AttnPlan {
            qkv_bias: false,
            qk_norm: false,
            rope: base.rope(RopeType::Normal),
            kind: AttnKind::Full,
            scale: attention_scale,
            scale_q: false,
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
