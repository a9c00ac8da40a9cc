//! Llama (and SmolLM2, which ships as `llama`): pre-norm blocks, SwiGLU feed-forward, RoPE on
//! adjacent pairs. llama.cpp's converter permutes the Q/K rows of HF checkpoints so that the
//! adjacent-pair rotation here equals HF's rotate-half.

use crate::config::{Activation, BaseHParams, Meta, Recipe, RopeType};
use crate::error::Result;

pub(super) fn configure(meta: &Meta, base: &BaseHParams) -> Result<Recipe> {
    // Some llama-family files store an explicit scale (`attention.scale`); 0 or absent means
    // the usual 1/sqrt(head_dim), as in llama.cpp.
    let attention_scale = meta
        .opt_f32("attention.scale")?
        .filter(|s| *s != 0.0)
        .unwrap_or_else(|| base.default_attention_scale());
    Ok(Recipe {
        rope_type: RopeType::Normal,
        activation: Activation::Silu,
        embedding_scale: 1.0,
        attention_scale,
        qkv_bias: false,
        qk_norm: false,
        post_norms: false,
        layers: base.uniform_layers(),
    })
}
