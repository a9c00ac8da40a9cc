//! Errors of model loading and the forward pass. Each names the file, metadata key or tensor and
//! says what was expected versus what was found.

use std::path::PathBuf;

use octoflow_gguf::quant::QuantError;
use octoflow_gguf::{GgmlType, GgufError};

/// What went wrong while loading a model or running it.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The GGUF file could not be opened or parsed.
    #[error("{path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: GgufError,
    },
    /// A metadata key is missing or has the wrong type (the source names the key).
    #[error("{0}")]
    Metadata(#[from] GgufError),
    /// `general.architecture` names an architecture we do not implement.
    #[error(
        "architecture {found:?} (general.architecture) is not supported; supported: {supported}"
    )]
    UnsupportedArchitecture {
        found: String,
        supported: &'static str,
    },
    /// A hyper-parameter has a value the forward pass cannot use.
    #[error("metadata key {key:?}: {problem}")]
    BadHyperParameter { key: String, problem: String },
    /// A tensor the architecture needs is absent.
    #[error("tensor {name:?} is missing (required by architecture {arch})")]
    MissingTensor { name: String, arch: &'static str },
    /// The block plan calls for a tensor the weights in hand lack (weights not loaded from
    /// that plan).
    #[error("the block plan calls for tensor {name:?}, which these weights lack")]
    PlanWithoutTensor { name: String },
    /// A tensor's shape disagrees with the hyper-parameters.
    #[error("tensor {name:?}: expected shape {expected:?} (ggml order), found {found:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    /// The model has a piece this path does not run (the message says which piece and path).
    #[error("{0}")]
    Unsupported(String),
    /// A tensor's element type has no CPU codec.
    #[error("tensor {name:?}: type {ty} is not supported by the CPU reference")]
    UnsupportedTensorType { name: String, ty: GgmlType },
    /// A matrix's element type is not one the GPU kernels read (`supported` lists those).
    #[error("tensor {name:?}: type {ty} is not supported on the GPU (supported: {supported})")]
    UnsupportedGpuTensorType {
        name: String,
        ty: GgmlType,
        supported: String,
    },
    /// A quant codec rejected a tensor's data.
    #[error("tensor {name:?}: {source}")]
    Quant {
        name: String,
        #[source]
        source: QuantError,
    },
    /// A token id is not below the vocabulary size.
    #[error(
        "token id {id} at batch index {index} is outside the vocabulary (n_vocab = {n_vocab})"
    )]
    TokenOutOfRange {
        id: u32,
        index: usize,
        n_vocab: usize,
    },
    /// The batch would run past the session's context size.
    #[error(
        "context overflow: positions up to {needed} are needed, but the context holds {n_ctx}"
    )]
    ContextOverflow { needed: usize, n_ctx: usize },
    /// `start_pos` is past the positions the KV cache holds.
    #[error("start position {start_pos} is past the {cached} positions in the KV cache")]
    StartPastCache { start_pos: usize, cached: usize },
    /// A forward pass was asked to process no tokens.
    #[error("the token batch is empty")]
    EmptyBatch,
    /// A batched step breaks the rules of [`crate::BatchForward::submit`] (the message says
    /// which row and why).
    #[error("invalid batch step: {0}")]
    Batch(String),
    /// The batch engine's KV pool has no blocks left for a step or a reservation.
    #[error(transparent)]
    KvFull(#[from] crate::kv_pool::KvFull),
    /// A draw asked of a device sampler that cannot take it (see `device_samples`).
    #[error("device sampling: {0}")]
    DeviceSampling(String),
    /// A LoRA adapter that cannot be applied (bad file, wrong model, bad shapes).
    #[error("LoRA: {0}")]
    Lora(String),
    /// The GPU path cannot run this model or request (the message says why).
    #[error("GPU: {0}")]
    Gpu(String),
    /// A GPU kernel could not be built or recorded.
    #[error(transparent)]
    Kernel(#[from] octoflow_kernels::KernelError),
    /// The Vulkan runtime failed (device, memory, submit).
    #[error(transparent)]
    Vulkan(#[from] octoflow_vk::VkError),
}

/// Shorthand for results of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
