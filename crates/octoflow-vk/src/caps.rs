//! What a device can do, as far as our kernels care: the capability record behind
//! `octoflow devices` and behind every shader-variant choice.

use serde::{Deserialize, Serialize};

/// Kind of physical device, in the order we prefer them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// A discrete GPU (preferred).
    Discrete,
    /// A GPU integrated with the CPU.
    Integrated,
    /// A virtualized GPU.
    Virtual,
    /// A CPU implementation such as Mesa lavapipe.
    Cpu,
    /// Anything else.
    Other,
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Discrete => "discrete GPU",
            DeviceKind::Integrated => "integrated GPU",
            DeviceKind::Virtual => "virtual GPU",
            DeviceKind::Cpu => "CPU",
            DeviceKind::Other => "other",
        })
    }
}

/// Subgroup (warp/wave) properties of the compute stage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubgroupCaps {
    /// Default subgroup size.
    pub size: u32,
    /// Smallest size selectable with subgroup size control (= `size` without it).
    pub min_size: u32,
    /// Largest size selectable with subgroup size control (= `size` without it).
    pub max_size: u32,
    /// Supported operations in the compute stage (`basic`, `vote`, `arithmetic`, `ballot`,
    /// `shuffle`, `shuffle_relative`, `clustered`, `quad`).
    pub ops: Vec<String>,
    /// A pipeline may require a subgroup size in `[min_size, max_size]` (VK 1.3 / EXT).
    pub size_control: bool,
    /// A pipeline may require full subgroups (`computeFullSubgroups`).
    pub full_subgroups: bool,
}

impl SubgroupCaps {
    /// Whether the named operation class (e.g. `"arithmetic"`) is supported.
    pub fn has(&self, op: &str) -> bool {
        self.ops.iter().any(|o| o == op)
    }
}

/// One matrix shape supported by VK_KHR_cooperative_matrix: `result[M×N] = A[M×K]·B[K×N] + C`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoopMatShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    /// Component types (`f16`, `f32`, `bf16`, `i8`, `u8`, `i32`, ...).
    pub a: String,
    pub b: String,
    pub c: String,
    pub result: String,
    /// Accumulation saturates (integer types).
    pub saturating: bool,
    /// `subgroup`, `workgroup`, `device` or `queue_family`.
    pub scope: String,
}

/// One memory heap.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Heap {
    /// Size in bytes.
    pub size: u64,
    /// Device-local (VRAM on a discrete GPU).
    pub device_local: bool,
}

/// Capabilities of one physical device, as listed by `octoflow devices`. Serializable both
/// ways, so variant choices can be tested against recorded devices (`fixtures/caps_*.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceCaps {
    /// Index in the loader's enumeration order (what `--gpu N` / `OCTOFLOW_GPU` select).
    pub index: usize,
    pub name: String,
    pub kind: DeviceKind,
    pub vendor_id: u32,
    pub device_id: u32,
    /// Driver name and info (VK 1.2 driver properties), e.g. `llvmpipe` / `Mesa 22.3.6`.
    pub driver_name: String,
    pub driver_info: String,
    /// Device API version, `major.minor.patch`.
    pub api_version: String,
    /// Raw API version (as `vk::make_api_version`).
    pub api_version_raw: u32,
    pub subgroup: SubgroupCaps,
    /// 16-bit float arithmetic in shaders (`shaderFloat16`).
    pub shader_float16: bool,
    /// 8-bit integer arithmetic in shaders (`shaderInt8`).
    pub shader_int8: bool,
    /// 16-bit integer arithmetic in shaders (`shaderInt16`).
    pub shader_int16: bool,
    /// 16-bit types in storage buffers (`storageBuffer16BitAccess`).
    pub storage_16bit: bool,
    /// 8-bit types in storage buffers (`storageBuffer8BitAccess`).
    pub storage_8bit: bool,
    /// VK_KHR_shader_integer_dot_product (core in 1.3).
    pub integer_dot_product: bool,
    /// 4×8-bit packed signed dot product is hardware accelerated.
    pub int8_dot_accelerated: bool,
    /// VK_KHR_cooperative_matrix supported shapes; `None` when the extension is absent.
    pub cooperative_matrix: Option<Vec<CoopMatShape>>,
    /// VK_NV_cooperative_matrix2 is exposed.
    pub cooperative_matrix2: bool,
    /// VK_KHR_pipeline_executable_properties with its feature: the driver reports per-pipeline
    /// statistics such as register counts ([`crate::Pipeline::statistics`]). Absent from
    /// device descriptions recorded before it existed (false).
    #[serde(default)]
    pub pipeline_statistics: bool,
    pub buffer_device_address: bool,
    pub timeline_semaphore: bool,
    /// The Vulkan memory model (`vulkanMemoryModel`): shaders that enable
    /// GL_KHR_memory_scope_semantics (the cooperative-matrix kernels) are compiled to it.
    /// Absent from device descriptions recorded before it existed.
    #[serde(default)]
    pub vulkan_memory_model: bool,
    /// Compute units (NVIDIA SMs from `VK_NV_shader_sm_builtins`, AMD compute units from
    /// `VK_AMD_shader_core_properties`); `None` where the driver reports no count. Absent from
    /// device descriptions recorded before it existed.
    #[serde(default)]
    pub compute_units: Option<u32>,
    /// `maxComputeSharedMemorySize`, bytes.
    pub max_shared_memory: u32,
    /// `maxMemoryAllocationSize`, bytes (one allocation).
    pub max_allocation: u64,
    /// `maxStorageBufferRange`, bytes (one storage-buffer binding).
    pub max_storage_buffer_range: u64,
    /// `maxPushConstantsSize`, bytes.
    pub max_push_constants: u32,
    /// `maxComputeWorkGroupInvocations`.
    pub max_workgroup_invocations: u32,
    /// `maxComputeWorkGroupCount`.
    pub max_workgroup_count: [u32; 3],
    /// `minStorageBufferOffsetAlignment`, bytes.
    pub storage_offset_alignment: u64,
    pub heaps: Vec<Heap>,
    /// Nanoseconds per timestamp tick.
    pub timestamp_period_ns: f32,
    /// The device has a compute queue (every usable one does).
    pub compute_queue: bool,
    /// The compute queue records timestamps.
    pub timestamps: bool,
    /// Valid bits of a compute-queue timestamp (0 without timestamps).
    pub timestamp_bits: u32,
    /// PCI address `dddd:bb:dd.f` (VK_EXT_pci_bus_info), how sensors (NVML, hwmon) find this
    /// device; `None` where the extension is absent (lavapipe). Absent from older recordings.
    #[serde(default)]
    pub pci_bus: Option<String>,
    /// `deviceUUID` (Vulkan 1.1) as 32 hex digits, the same bytes NVML's `GPU-…` UUID spells;
    /// `None` below Vulkan 1.2 here. Absent from older recordings.
    #[serde(default)]
    pub device_uuid: Option<String>,
}

impl DeviceCaps {
    /// Bytes of the largest device-local heap.
    pub fn device_local_bytes(&self) -> u64 {
        self.heaps
            .iter()
            .filter(|h| h.device_local)
            .map(|h| h.size)
            .max()
            .unwrap_or(0)
    }

    /// Largest single buffer this device binds as one storage buffer and allocates at once.
    pub fn max_buffer_bytes(&self) -> u64 {
        self.max_allocation.min(self.max_storage_buffer_range)
    }

    /// Whether a cooperative-matrix shape with these types and sizes is supported.
    pub fn coopmat_supports(&self, m: u32, n: u32, k: u32, ab: &str, acc: &str) -> bool {
        self.cooperative_matrix.as_ref().is_some_and(|shapes| {
            shapes.iter().any(|s| {
                (s.m, s.n, s.k) == (m, n, k)
                    && s.a == ab
                    && s.b == ab
                    && s.c == acc
                    && s.result == acc
            })
        })
    }
}
