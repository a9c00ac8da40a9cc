//! Errors reading a Hugging Face folder: each names the file, and the tensor or key, at fault.

use std::path::PathBuf;

/// Why a folder could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A required file is absent (no weights, a shard the index names, config.json).
    #[error("{path}: missing ({why})")]
    Missing { path: PathBuf, why: String },
    /// A SafeTensors file whose header or data does not hold together (truncated, corrupt).
    #[error("{path}: invalid SafeTensors file: {problem}")]
    SafeTensors { path: PathBuf, problem: String },
    /// A key of a JSON file is absent or has the wrong type or value.
    #[error("{path}: key {key:?}: {problem}")]
    Key {
        path: PathBuf,
        key: String,
        problem: String,
    },
    /// A tensor is absent, unexpected, or disagrees with config.json.
    #[error("{path}: tensor {tensor:?}: {problem}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        problem: String,
    },
    /// An architecture or tokenizer this reader does not map to GGUF.
    #[error("{path}: {what} is not supported ({supported})")]
    Unsupported {
        path: PathBuf,
        what: String,
        supported: String,
    },
    #[error(transparent)]
    Gguf(#[from] octoflow_gguf::GgufError),
}

/// This crate's result type.
pub type Result<T, E = HfError> = std::result::Result<T, E>;
