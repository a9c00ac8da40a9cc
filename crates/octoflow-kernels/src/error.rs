//! Errors of kernel recording.

use octoflow_vk::VkError;

/// A kernel could not be built or recorded.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The runtime failed (device, pipeline, binding).
    #[error(transparent)]
    Vk(#[from] VkError),
    /// Operands do not match the op's shapes.
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },
}

/// Result with [`KernelError`].
pub type Result<T, E = KernelError> = std::result::Result<T, E>;
