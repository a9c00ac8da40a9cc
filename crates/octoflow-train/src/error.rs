//! Training errors.

/// What can go wrong while training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A bad option or an inconsistent run configuration.
    #[error("{0}")]
    Config(String),
    /// A loss or gradient that is NaN or infinite.
    #[error("training diverged: {0}")]
    NonFinite(String),
    /// The trainer's chain was not recorded (a previous error left it unusable).
    #[error("the training chain is not recorded")]
    NoChain,
    #[error(transparent)]
    Vk(#[from] octoflow_vk::VkError),
    #[error(transparent)]
    Kernel(#[from] octoflow_kernels::KernelError),
    #[error(transparent)]
    Model(#[from] octoflow_model::ModelError),
}

/// Training results.
pub type Result<T> = std::result::Result<T, TrainError>;
