//! Errors of tokenizer construction and chat-template rendering. Each names the metadata key,
//! file or template and says what was expected versus found.

use std::path::PathBuf;

/// What went wrong while building a tokenizer or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// Reading a GGUF metadata value failed (missing key, wrong type).
    #[error(transparent)]
    Gguf(#[from] octoflow_gguf::GgufError),
    /// A metadata value is present but unusable.
    #[error("metadata {key}: {problem}")]
    Metadata { key: String, problem: String },
    /// `tokenizer.ggml.model` names a tokenizer family we do not implement.
    #[error(
        "tokenizer.ggml.model = {0:?} is not supported (supported: \"gpt2\" = byte-level BPE, \
         \"llama\" = SentencePiece BPE with scores)"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer we do not implement.
    #[error("tokenizer.ggml.pre = {found:?} is not supported (supported: {supported})")]
    UnsupportedPre { found: String, supported: String },
    /// Two vocabulary entries have the same text.
    #[error("tokenizer.ggml.tokens: {text:?} appears twice, as ids {first} and {second}")]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A `tokenizer.json` could not be read, disagrees with the model's vocabulary, or failed
    /// to encode a text.
    #[error("{path}: {message}")]
    TokenizerJson { path: PathBuf, message: String },
    /// A chat template failed to compile or to render.
    #[error("chat template ({origin}): {message}")]
    Template { origin: String, message: String },
}

impl TextError {
    pub(crate) fn metadata(key: &str, problem: impl Into<String>) -> Self {
        Self::Metadata {
            key: key.to_string(),
            problem: problem.into(),
        }
    }

    /// A template error, with minijinja's error chain (it names the line) flattened into text.
    pub(crate) fn template(origin: &str, err: &minijinja::Error) -> Self {
        let mut message = err.to_string();
        let mut source = std::error::Error::source(err);
        while let Some(inner) = source {
            message.push_str(": ");
            message.push_str(&inner.to_string());
            source = inner.source();
        }
        Self::Template {
            origin: origin.to_string(),
            message,
        }
    }
}
