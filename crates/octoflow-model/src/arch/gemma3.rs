//! Gemma 3 (text): embeddings scaled by `sqrt(n_embd)`, per-head RMSNorm of Q and K, RMSNorm
//! after attention and after the feed-forward block, GELU-tanh gate, NeoX RoPE, and
//! interleaved sliding-window layers.
//!
//! Facts taken from llama.cpp (`llama-model.cpp`, `models/gemma3.cpp`, `convert_hf_to_gguf.py`):
//! - Layer `il` is a sliding-window layer unless `il % 6 == 5` (`set_swa_pattern(6)`); window
//!   from `gemma3.attention.sliding_window`.
//! - Sliding-window layers use RoPE base 10000 without scaling; global layers use
//!   `rope.freq_base` and the file's rope scaling.
//! - The converter already adds 1 to every `*norm.weight` (HF's Gemma RMSNorm multiplies by
//!   `1 + w`), so the norms here are plain RMSNorms.
//! - Q is scaled by `1/sqrt(head_dim)` (`query_pre_attn_scalar = head_dim`), except for the
//!   62-layer 27B model, which uses `1/sqrt(n_embd / n_head)`.
//! - No logit soft-capping in the sliding-window graph.

use crate::config::{Activation, BaseHParams, Meta, Recipe, RopeType};
use crate::error::Result;
use crate::plan::{AttnKind, AttnPlan, BlockPlan, FfnPlan, GluPlan, RopePlan};

/// Every `SWA_PATTERN`-th layer (the last of each group) attends globally.
const SWA_PATTERN: usize = 6;
/// RoPE base of the sliding-window layers.
const SWA_ROPE_BASE: f32 = 10_000.0;
/// Layer count of Gemma 3 27B, the one size whose query scale differs.
const N_LAYER_27B: usize = 62;

pub(super) fn configure(meta: &Meta, base: &BaseHParams) -> Result<Recipe> {
    let window = meta.req_usize("attention.sliding_window")?;
    if window == 0 {
        return Err(meta.bad("attention.sliding_window", "must be positive, found 0"));
    }
    let query_pre_attn_scalar = if base.n_layer == N_LAYER_27B {
        (base.n_embd / base.n_head) as f32
    } else {
        base.head_dim as f32
    };
    let blocks = (0..base.n_layer)
        .map(|il| {
            let (kind, rope) = if il % SWA_PATTERN < SWA_PATTERN - 1 {
                let local = RopePlan {
                    kind: RopeType::Neox,
                    base: SWA_ROPE_BASE,
                    scale: 1.0,
                    yarn: None,
                };
                (AttnKind::SlidingWindow(window), local)
            } else {
                (AttnKind::Full, base.rope(RopeType::Neox))
            };
            BlockPlan {
                attn: AttnPlan {
                    qkv_bias: false,
                    qk_norm: true,
                    rope,
                    kind,
                    scale: 1.0 / query_pre_attn_scalar.sqrt(),
                    scale_q: false,
                    post_norm: true,
                    out_bias: false,
                    sinks: false,
                },
                ffn: FfnPlan::Glu(GluPlan {
                    act: Activation::GeluTanh,
                    post_norm: true,
                }),
            }
        })
        .collect();
    Ok(Recipe {
        embedding_scale: (base.n_embd as f32).sqrt(),
        blocks,
    })
}
