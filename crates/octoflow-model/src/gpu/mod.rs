//! The forward pass on a Vulkan device: weights uploaded once in their GGUF encoding, every
//! token step recorded as one dispatch chain and replayed.
//!
//! - [`weights`]: tensors on the device (split by rows where one binding is too small).
//! - [`adapters`]: LoRA adapters on the device, applied on the fly (several, per-token mixes).
//! - [`kernels`]: the pipelines (`octoflow-kernels`), built once per model.
//! - [`scratch`]: a session's buffers: control block, activations, logits, KV cache.
//! - [`graph`]: recording one forward pass of `n` tokens (the GPU twin of `forward.rs`).
//! - [`session`]: [`GpuModel`] and [`GpuSession`]: batch chains for prompts and scoring, and
//!   multi-step decode chains whose sampled tokens never leave the GPU between steps.

pub mod adapters;
pub mod batch;
pub mod graph;
pub mod kernels;
pub mod scratch;
pub mod session;
pub mod weights;

pub use adapters::{GpuAdapters, MixSource};
pub use batch::{DeviceRows, GpuBatch};
pub use session::{GpuModel, GpuSession, BATCH_TOKENS};
// what the caches hold (`GpuModel::set_kv_type`), named where the binary picks it
pub use octoflow_kernels::{KvType, UnknownKvType};

#[cfg(test)]
#[path = "arch_tests.rs"]
mod arch_tests;
