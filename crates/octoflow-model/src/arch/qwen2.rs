//! Qwen2 / Qwen2.5: the llama block with biases on the Q, K and V projections and RoPE in the
//! NeoX layout (pairs `(i, i + n_rot/2)`).

use crate::config::{Activation, BaseHParams, Recipe, RopeType};
use crate::plan::{AttnKind, AttnPlan, BlockPlan, FfnPlan, GluPlan};

pub(super) fn configure(base: &BaseHParams) -> Recipe {
    let block = BlockPlan {
        attn: AttnPlan {
            qkv_bias: true,
            qk_norm: false,
            rope: base.rope(RopeType::Neox),
            kind: AttnKind::Full,
            scale: base.default_attention_scale(),
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
    Recipe {
        embedding_scale: 1.0,
        blocks: vec![block; base.n_layer],
    }
}
