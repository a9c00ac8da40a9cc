//! [`TrainError`]: everything that can go wrong reading data, checkpoints and logs.

use std::path::PathBuf;

/// An error of the training support code. Data errors name the file and the 1-based line.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A file could not be read, written, synced or renamed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A training-data record is malformed or cannot be tokenized.
    #[error("{}:{line}: {message}", path.display())]
    Data {
        /// The JSONL file.
        path: PathBuf,
        /// 1-based line number of the record.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A checkpoint file is corrupt, truncated or cannot be written.
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A line of the loss log is not a JSON object.
    #[error("loss log {}:{line}: {message}", path.display())]
    Log {
        /// The log file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// An unknown learning-rate schedule name.
    #[error("unknown learning-rate schedule {0:?} (expected constant, linear or cosine)")]
    UnknownSchedule(String),
}

impl TrainError {
    /// An I/O error about `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// The result of training support operations.
pub type Result<T> = std::result::Result<T, TrainError>;
