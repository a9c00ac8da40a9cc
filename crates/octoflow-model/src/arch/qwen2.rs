//! Qwen2 / Qwen2.5: the llama block with biases on the Q, K and V projections and RoPE in the
//! NeoX layout (pairs `(i, i + n_rot/2)`).

use crate::config::{Activation, BaseHParams, Recipe, RopeType};

pub(super) fn configure(base: &BaseHParams) -> Recipe {
    Recipe {
        rope_type: RopeType::Neox,
        activation: Activation::Silu,
        embedding_scale: 1.0,
        attention_scale: base.default_attention_scale(),
        qkv_bias: true,
        qk_norm: false,
        post_norms: false,
        layers: base.uniform_layers(),
    }
}
