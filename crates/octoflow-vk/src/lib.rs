//! Generic Vulkan compute runtime on ash: devices, memory, pipelines, dispatch chains,
//! timestamps. Nothing here knows about models; kernels and architectures build on it.
//!
//! - [`Context`]: an open device ([`Context::new`] with a [`DeviceChoice`]; `OCTOFLOW_GPU`
//!   overrides the automatic choice). [`list_devices`] returns every device's [`DeviceCaps`].
//! - [`Buffer`]: RAII storage buffer in [`MemoryKind`] memory; [`BufferSlice`] binds a range.
//!   [`ChunkedBuffer`], [`split_plan`] and [`pack_plan`] handle data larger than one buffer.
//!   [`Context::upload`], [`Context::download`], [`Context::fill`] move data synchronously.
//! - [`Pipeline`]: a compute pipeline from an embedded [`Shader`] ([`PipelineDesc`]); a context
//!   opened with [`Context::with_pipeline_cache`] keeps compiled pipelines on disk between runs.
//! - [`Chain`]: dispatches, barriers, fills and copies recorded once and replayed with
//!   [`Chain::submit`]/[`Chain::wait`]; per-dispatch GPU times with [`Chain::with_profiling`].
//!   A context opens up to [`MAX_QUEUES`] compute queues ([`Context::queue_count`]);
//!   [`Chain::set_queue`] spreads independent chains over them so they can overlap (transfers
//!   use queue 0). [`Chain::submit_after`] holds a submitted chain until the host signals a
//!   [`Timeline`], for work whose tail needs data the host computes while the head runs.
//!
//! Ownership: every object holds an `Arc` to the device, so the device is destroyed last;
//! chains hold clones of the buffers and pipelines they use. Transfers are synchronous and must
//! not overlap a running chain that touches the same buffers.

mod buffer;
mod caps;
mod chain;
mod chunked;
mod context;
mod descriptor;
mod error;
mod features;
mod gate;
mod grid;
mod instance;
mod pipeline;
mod pipeline_cache;
mod plain;
mod probe;
mod push;
mod record;
mod span;
pub mod testing;
mod timeline;
mod timestamps;
mod transfer;

pub use ash::vk;
pub use buffer::{Buffer, BufferSlice, MemoryKind};
pub use caps::{CoopMatShape, DeviceCaps, DeviceKind, Heap, SubgroupCaps};
pub use chain::Chain;
pub use chunked::{pack_plan, split_plan, ChunkedBuffer, Placement};
pub use context::{choose_device, list_devices, Context, DeviceChoice, GPU_ENV, MAX_QUEUES};
pub use error::{Result, VkError};
pub use gate::gate_words;
pub use grid::groups_1d;
pub use instance::VALIDATION_ENV;
pub use pipeline::{Pipeline, PipelineDesc, Shader};
pub use pipeline_cache::CacheLoad;
pub use plain::{as_bytes, as_bytes_mut, Plain};
pub use push::Push;
pub use timeline::Timeline;
pub use timestamps::{summarize, summarize_at, Cost, DispatchTime, LabelTime, FLOOR_RATES};

/// Shaders used by this crate's own tests, built from `test_shaders/` by build.rs.
#[cfg(test)]
#[allow(dead_code)]
mod test_shaders {
    include!(concat!(env!("OUT_DIR"), "/test_shaders.rs"));
}

#[cfg(test)]
mod tests;
