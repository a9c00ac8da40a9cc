//! Typed errors of the Vulkan runtime.

use ash::vk;

/// Everything that can go wrong in the runtime. Messages name the object (buffer, pipeline,
/// device) and what was expected versus found.
#[derive(Debug, thiserror::Error)]
pub enum VkError {
    /// `libvulkan.so.1` (the Vulkan loader) could not be loaded.
    #[error("no Vulkan loader: {0} (install libvulkan1 and a driver, e.g. mesa-vulkan-drivers)")]
    NoLoader(String),
    /// The loader works but reports no physical device.
    #[error(
        "no Vulkan device found (install a driver, e.g. mesa-vulkan-drivers for CPU lavapipe)"
    )]
    NoDevice,
    /// The device index given by `--gpu` or `OCTOFLOW_GPU` does not exist.
    #[error("device index {index} requested by {source_of} but only {count} device(s) exist")]
    NoSuchDevice {
        index: usize,
        count: usize,
        source_of: String,
    },
    /// `OCTOFLOW_GPU` is not a device index.
    #[error("OCTOFLOW_GPU={value:?} is not a device index (expected 0, 1, ...)")]
    BadDeviceEnv { value: String },
    /// The device lacks something the runtime needs.
    #[error("device {device:?} is unsupported: {reason}")]
    Unsupported { device: String, reason: String },
    /// The device heap could not hold an allocation.
    #[error("out of device memory allocating {requested} bytes for {what:?} (largest heap: {heap_size} bytes)")]
    OutOfDeviceMemory {
        what: String,
        requested: u64,
        heap_size: u64,
    },
    /// Host memory ran out inside the driver.
    #[error("out of host memory in {call}")]
    OutOfHostMemory { call: &'static str },
    /// A single buffer larger than the device allows; use `ChunkedBuffer` to split it.
    #[error("buffer {what:?} of {requested} bytes exceeds the device limit {limit_name} = {limit} (split it with ChunkedBuffer)")]
    BufferTooLarge {
        what: String,
        requested: u64,
        limit_name: &'static str,
        limit: u64,
    },
    /// A zero-sized buffer was requested.
    #[error("buffer {what:?} has size 0")]
    EmptyBuffer { what: String },
    /// An access outside a buffer or a misaligned binding.
    #[error("buffer {what:?}: {detail}")]
    BadRange { what: String, detail: String },
    /// A buffer that must be host-visible (mapped) is not.
    #[error("buffer {what:?} is not host-visible; use Context::upload/download")]
    NotMapped { what: String },
    /// The SPIR-V given for a pipeline is malformed.
    #[error("pipeline {pipeline:?}: invalid SPIR-V ({detail})")]
    BadSpirv { pipeline: String, detail: String },
    /// A dispatch does not match its pipeline's layout.
    #[error("dispatch of {pipeline:?}: {detail}")]
    BadDispatch { pipeline: String, detail: String },
    /// Profiling was requested on a queue without timestamp support.
    #[error("device {device:?} has no compute-queue timestamps; profiling is unavailable")]
    NoTimestamps { device: String },
    /// The device was lost (driver crash, hang, or a shader fault).
    #[error("Vulkan device lost during {call}")]
    DeviceLost { call: &'static str },
    /// Any other Vulkan failure.
    #[error("{call} failed: {result}")]
    Vulkan {
        call: &'static str,
        result: vk::Result,
    },
    /// The pipeline cache could not be written to disk.
    #[error("saving the pipeline cache {path:?}: {detail}")]
    PipelineCacheIo {
        path: std::path::PathBuf,
        detail: String,
    },
    /// The memory allocator failed for a reason other than exhausted memory.
    #[error("allocating {what:?}: {detail}")]
    Allocator { what: String, detail: String },
}

/// Result with [`VkError`].
pub type Result<T, E = VkError> = std::result::Result<T, E>;

/// Maps a raw Vulkan result from `call` to a [`VkError`].
pub(crate) fn vk_error(call: &'static str, result: vk::Result) -> VkError {
    match result {
        vk::Result::ERROR_OUT_OF_HOST_MEMORY => VkError::OutOfHostMemory { call },
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY => VkError::OutOfDeviceMemory {
            what: call.to_string(),
            requested: 0,
            heap_size: 0,
        },
        vk::Result::ERROR_DEVICE_LOST => VkError::DeviceLost { call },
        result => VkError::Vulkan { call, result },
    }
}

/// `map_err` adapter: `.map_err(vk_err("vkCreateBuffer"))`.
pub(crate) fn vk_err(call: &'static str) -> impl Fn(vk::Result) -> VkError {
    move |result| vk_error(call, result)
}
