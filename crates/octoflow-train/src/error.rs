//! [`TrainError`]: everything that can go wrong in training: data, checkpoints, logs, options,
//! the device.

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
    /// A bad option or an inconsistent run configuration.
    #[error("{0}")]
    Config(String),
    /// A loss or gradient that is NaN or infinite.
    #[error("training diverged: {0}")]
    NonFinite(String),
    /// The trainer's chain was not recorded (a previous error left it unusable).
    #[error("the training chain is not recorded")]
    NoChain,
    /// An error of one of several concurrent runs ([`crate::run::train_many`]).
    #[error("run {}: {source}", dir.display())]
    Run {
        /// The run's directory.
        dir: PathBuf,
        /// What went wrong in it.
        source: Box<TrainError>,
    },
    /// The Vulkan runtime failed (device lost, out of device memory, ...).
    #[error(transparent)]
    Vk(#[from] octoflow_vk::VkError),
    /// A kernel rejected its operands.
    #[error(transparent)]
    Kernel(#[from] octoflow_kernels::KernelError),
    /// The model could not be loaded or recorded.
    #[error(transparent)]
    Model(#[from] octoflow_model::ModelError),
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
