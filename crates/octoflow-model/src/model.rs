//! A loaded model: its hyper-parameters, its weights and the file they live in.

use std::path::Path;
use std::sync::Arc;

use octoflow_gguf::GgufFile;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::forward::Session;
use crate::numerics::Numerics;
use crate::weights::ModelWeights;

/// A model ready to run: config and weights bound to a memory-mapped GGUF file.
#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    file: Arc<GgufFile>,
}

impl Model {
    /// Opens and binds the GGUF file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = GgufFile::open(path).map_err(|source| ModelError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_gguf(Arc::new(file))
    }

    /// Reads the config from `file`'s metadata and binds its tensors.
    pub fn from_gguf(file: Arc<GgufFile>) -> Result<Self> {
        let config = ModelConfig::from_gguf(&file)?;
        let weights = ModelWeights::from_gguf(&file, &config)?;
        Ok(Self {
            config,
            weights,
            file,
        })
    }

    /// The GGUF file (for tokenizer metadata and the like).
    pub fn gguf(&self) -> &GgufFile {
        &self.file
    }

    /// A new sequence with an empty KV cache of at most `n_ctx` positions.
    pub fn session(&self, n_ctx: usize) -> Session<'_> {
        Session::new(self, n_ctx)
    }

    /// A new sequence that rounds as `numerics` says ([`Numerics::Ggml`]: as llama.cpp's CPU
    /// backend).
    pub fn session_with(&self, n_ctx: usize, numerics: Numerics) -> Session<'_> {
        Session::with_numerics(self, n_ctx, numerics)
    }
}
