//! GPT-OSS (OpenAI's open-weight mixture of experts; llama.cpp's `gpt-oss`, class
//! `openai_moe`): pre-norm blocks whose attention has Q/K/V and output biases and learned
//! per-head sink logits, sliding-window layers alternating with full ones, NeoX RoPE with YaRN
//! scaling, and a mixture-of-experts feed-forward.
//!
//! Facts from llama.cpp (`models/openai-moe.cpp`, `llama-graph.cpp`'s `build_moe_ffn`,
//! `llama-hparams.cpp`, `llama-context.cpp`, ggml-cpu's `swiglu_oai` and `soft_max` with sinks):
//! - Layer `il` attends through a window of `attention.sliding_window` positions when
//!   `il % 2 == 0` (`set_swa_pattern(2)`), else fully; the same RoPE base and scale in both
//!   (`rope.freq_base_swa` absent: the global base).
//! - The feed-forward's pre-norm is stored as `post_attention_norm` (`attn_post_norm`).
//! - Routing: `logits = ffn_gate_inp · h + bias`, the `expert_used_count` largest are
//!   selected, their weights are the softmax of their logits (`SOFTMAX_WEIGHT`), no further
//!   normalization or scale.
//! - Each expert: `gate = W_gate h + b`, `up = W_up h + b`, `swiglu_oai(gate, up)` with
//!   `alpha = 1.702`, `limit = 7`, then `W_down · + b`.
//! - Attention scale `1/sqrt(head_dim)`; the softmax denominator also counts `exp(sink_h)`.

use crate::config::{BaseHParams, Meta, Recipe, RopeType};
use crate::error::Result;
use crate::plan::{AttnKind, AttnPlan, BlockPlan, FfnPlan, Gating, MoeAct, MoePlan};

/// Every `SWA_PATTERN`-th layer, starting with the second, attends fully.
const SWA_PATTERN: usize = 2;
/// `swiglu_oai`'s constants in llama.cpp's `LLM_FFN_SWIGLU_OAI_MOE`.
const ALPHA: f32 = 1.702;
const LIMIT: f32 = 7.0;

pub(super) fn configure(meta: &Meta, base: &BaseHParams) -> Result<Recipe> {
    let window = meta.req_usize("attention.sliding_window")?;
    if window == 0 {
        return Err(meta.bad("attention.sliding_window", "must be positive, found 0"));
    }
    let n_expert = meta.req_usize("expert_count")?;
    let n_used = meta.req_usize("expert_used_count")?;
    if n_used == 0 || n_used > n_expert {
        return Err(meta.bad(
            "expert_used_count",
            &format!("must be between 1 and expert_count ({n_expert}), found {n_used}"),
        ));
    }
    let n_ff = meta.req_usize("expert_feed_forward_length")?;
    let moe = MoePlan {
        n_expert,
        n_used,
        n_ff,
        gating: Gating::SoftmaxOfSelected,
        act: MoeAct::SwigluOai {
            alpha: ALPHA,
            limit: LIMIT,
        },
        biases: true,
        weights_scale: super::expert_weights_scale(meta)?,
    };
    let blocks = (0..base.n_layer)
        .map(|il| BlockPlan {
            attn: AttnPlan {
                qkv_bias: true,
                qk_norm: false,
                rope: base.rope(RopeType::Neox),
                kind: if il % SWA_PATTERN < SWA_PATTERN - 1 {
                    AttnKind::SlidingWindow(window)
                } else {
                    AttnKind::Full
                },
                scale: base.default_attention_scale(),
                scale_q: false,
                post_norm: false,
                out_bias: true,
                sinks: true,
            },
            ffn: FfnPlan::Moe(moe),
        })
        .collect();
    Ok(Recipe {
        embedding_scale: 1.0,
        blocks,
    })
}
