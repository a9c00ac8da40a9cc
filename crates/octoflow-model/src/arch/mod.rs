//! The supported architectures. Each file turns the shared hyper-parameters (and its family's
//! own keys) into the plan of its blocks ([`crate::plan::BlockPlan`]: which norms and biases
//! exist, RoPE pairing and frequencies, attention kind per layer, the feed-forward). Every
//! forward walks that plan, so a family built from known pieces is one file here.

mod gemma3;
mod gpt_oss;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;
mod qwen3moe;

use crate::config::{BaseHParams, Meta, Recipe};
use crate::error::Result;

/// A model family, named as in `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Llama and its descendants (SmolLM2): SwiGLU, normal RoPE.
    Llama,
    /// Qwen2 / Qwen2.5: llama plus Q/K/V biases and NeoX RoPE.
    Qwen2,
    /// Gemma 3: GeGLU, Q/K norms, post-norms, scaled embeddings, sliding-window layers.
    Gemma3,
    /// Qwen3 (dense): llama plus per-head Q/K norms, NeoX RoPE.
    Qwen3,
    /// Phi-3: llama with fused QKV and gate-up matrices (split at load), NeoX RoPE.
    Phi3,
    /// Qwen3-MoE: qwen3's attention with a mixture-of-experts feed-forward.
    Qwen3Moe,
    /// GPT-OSS: mixture of experts, attention sinks and biases, alternating sliding-window
    /// layers, YaRN RoPE.
    GptOss,
}

impl Architecture {
    /// The supported names, for error messages.
    pub const SUPPORTED: &'static str = "llama, qwen2, qwen3, qwen3moe, gemma3, phi3, gpt-oss";

    /// Parses a `general.architecture` value.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Self::Llama),
            "qwen2" => Some(Self::Qwen2),
            "gemma3" => Some(Self::Gemma3),
            "qwen3" => Some(Self::Qwen3),
            "phi3" => Some(Self::Phi3),
            "gpt-oss" => Some(Self::GptOss),
            "qwen3moe" => Some(Self::Qwen3Moe),
            _ => None,
        }
    }

    /// The `general.architecture` value, also the prefix of its metadata keys.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Gemma3 => "gemma3",
            Self::Qwen3 => "qwen3",
            Self::Phi3 => "phi3",
            Self::GptOss => "gpt-oss",
            Self::Qwen3Moe => "qwen3moe",
        }
    }
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The recipe of `meta.arch`, from the shared hyper-parameters and the family's own keys.
pub(crate) fn configure(meta: &Meta, base: &BaseHParams) -> Result<Recipe> {
    match meta.arch {
        Architecture::Llama => llama::configure(meta, base),
        Architecture::Qwen2 => Ok(qwen2::configure(base)),
        Architecture::Gemma3 => gemma3::configure(meta, base),
        Architecture::Qwen3 => Ok(qwen3::configure(base)),
        Architecture::Phi3 => phi3::configure(meta, base),
        Architecture::GptOss => gpt_oss::configure(meta, base),
        Architecture::Qwen3Moe => qwen3moe::configure(meta, base),
    }
}

/// `expert_weights_scale`: a factor on the selected experts' weights (llama.cpp applies it
/// when it is neither 0 nor 1; absent means 1).
fn expert_weights_scale(meta: &Meta) -> Result<f32> {
    Ok(match meta.opt_f32("expert_weights_scale")? {
        None | Some(0.0) => 1.0,
        Some(s) => s,
    })
}
