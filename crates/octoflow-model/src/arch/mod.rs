//! The supported architectures. Each file turns the shared hyper-parameters into a
//! [`Recipe`]: what is particular to its family (RoPE style, activation, which norms and biases
//! exist, per-layer attention windows). The forward pass reads only the resulting
//! [`crate::ModelConfig`], so a new family with the same block shape needs only a new file here.

mod gemma3;
mod llama;
mod qwen2;

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
}

impl Architecture {
    /// The supported names, for error messages.
    pub const SUPPORTED: &'static str = "llama, qwen2, gemma3";

    /// Parses a `general.architecture` value.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Self::Llama),
            "qwen2" => Some(Self::Qwen2),
            "gemma3" => Some(Self::Gemma3),
            _ => None,
        }
    }

    /// The `general.architecture` value, also the prefix of its metadata keys.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Gemma3 => "gemma3",
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
    }
}
