//! Reads a physical device's properties and features into a [`DeviceCaps`].

use std::ffi::CStr;

use ash::{khr, vk};

use crate::caps::{CoopMatShape, DeviceCaps, DeviceKind, Heap, SubgroupCaps};
use crate::error::{vk_err, Result};
use crate::instance::Instance;

/// Extension names we look for.
pub(crate) const COOPMAT_EXT: &CStr = c"VK_KHR_cooperative_matrix";
pub(crate) const COOPMAT2_EXT: &CStr = c"VK_NV_cooperative_matrix2";
pub(crate) const PIPELINE_EXEC_EXT: &CStr = c"VK_KHR_pipeline_executable_properties";
const SM_BUILTINS_EXT: &CStr = c"VK_NV_shader_sm_builtins";
const AMD_CORE_EXT: &CStr = c"VK_AMD_shader_core_properties";
const PCI_BUS_EXT: &CStr = c"VK_EXT_pci_bus_info";

/// Properties and features of one physical device, plus the queue family we compute on.
pub(crate) struct Probe {
    pub caps: DeviceCaps,
    pub queue_family: Option<u32>,
    /// Queues in `queue_family` (0 without one).
    pub queue_count: u32,
}

/// Probes physical device `pdev`, listed at `index`.
pub(crate) fn probe(instance: &Instance, pdev: vk::PhysicalDevice, index: usize) -> Result<Probe> {
    let inst = &instance.raw;
    // SAFETY: `pdev` came from this instance; every query below only reads.
    let base = unsafe { inst.get_physical_device_properties(pdev) };
    let api = base.api_version.min(instance.api_version);
    let extensions = unsafe { inst.enumerate_device_extension_properties(pdev) }
        .map_err(vk_err("vkEnumerateDeviceExtensionProperties"))?;
    let has_ext = |name: &CStr| {
        extensions
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(name))
    };
    let has_coopmat = has_ext(COOPMAT_EXT) && api >= vk::API_VERSION_1_3;

    let mut p11 = vk::PhysicalDeviceVulkan11Properties::default();
    let mut p12 = vk::PhysicalDeviceVulkan12Properties::default();
    let mut p13 = vk::PhysicalDeviceVulkan13Properties::default();
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut fcm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let has_exec = has_ext(PIPELINE_EXEC_EXT);
    let mut fpe = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let has_sm = has_ext(SM_BUILTINS_EXT);
    let has_amd = has_ext(AMD_CORE_EXT);
    let mut psm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
    let mut pamd = vk::PhysicalDeviceShaderCorePropertiesAMD::default();
    let has_pci = has_ext(PCI_BUS_EXT);
    let mut ppci = vk::PhysicalDevicePCIBusInfoPropertiesEXT::default();
    let mut props = vk::PhysicalDeviceProperties2::default();
    let mut feats = vk::PhysicalDeviceFeatures2::default();
    if api >= vk::API_VERSION_1_2 {
        props = props.push_next(&mut p11).push_next(&mut p12);
        feats = feats.push_next(&mut f11).push_next(&mut f12);
    }
    if api >= vk::API_VERSION_1_3 {
        props = props.push_next(&mut p13);
        feats = feats.push_next(&mut f13);
    }
    if has_coopmat {
        feats = feats.push_next(&mut fcm);
    }
    if has_sm {
        props = props.push_next(&mut psm);
    }
    if has_amd {
        props = props.push_next(&mut pamd);
    }
    if has_exec {
        feats = feats.push_next(&mut fpe);
    }
    if has_pci {
        props = props.push_next(&mut ppci);
    }
    unsafe {
        inst.get_physical_device_properties2(pdev, &mut props);
        inst.get_physical_device_features2(pdev, &mut feats);
    }
    let core = feats.features;
    let limits = props.properties.limits;
    let v13 = api >= vk::API_VERSION_1_3;
    let (queue_family, timestamp_bits, queue_count) = compute_queue(inst, pdev);
    let cooperative_matrix = if has_coopmat && fcm.cooperative_matrix == vk::TRUE {
        Some(coopmat_shapes(instance, pdev)?)
    } else {
        None
    };

    let caps = DeviceCaps {
        index,
        name: cstr(base.device_name_as_c_str()),
        kind: kind_of(base.device_type),
        vendor_id: base.vendor_id,
        device_id: base.device_id,
        driver_name: cstr(p12.driver_name_as_c_str()),
        driver_info: cstr(p12.driver_info_as_c_str()),
        api_version: format!(
            "{}.{}.{}",
            vk::api_version_major(base.api_version),
            vk::api_version_minor(base.api_version),
            vk::api_version_patch(base.api_version)
        ),
        api_version_raw: base.api_version,
        subgroup: subgroup_caps(&p11, &p13, &f13, v13),
        shader_float16: f12.shader_float16 == vk::TRUE,
        shader_int8: f12.shader_int8 == vk::TRUE,
        shader_int16: core.shader_int16 == vk::TRUE,
        storage_16bit: f11.storage_buffer16_bit_access == vk::TRUE,
        storage_8bit: f12.storage_buffer8_bit_access == vk::TRUE,
        integer_dot_product: v13 && f13.shader_integer_dot_product == vk::TRUE,
        int8_dot_accelerated: v13
            && p13.integer_dot_product4x8_bit_packed_signed_accelerated == vk::TRUE,
        cooperative_matrix,
        cooperative_matrix2: has_ext(COOPMAT2_EXT),
        pipeline_statistics: has_exec && fpe.pipeline_executable_info == vk::TRUE,
        buffer_device_address: f12.buffer_device_address == vk::TRUE,
        timeline_semaphore: f12.timeline_semaphore == vk::TRUE,
        vulkan_memory_model: f12.vulkan_memory_model == vk::TRUE,
        compute_units: compute_units(has_sm.then_some(&psm), has_amd.then_some(&pamd)),
        max_shared_memory: limits.max_compute_shared_memory_size,
        max_allocation: if api >= vk::API_VERSION_1_2 {
            p11.max_memory_allocation_size
        } else {
            0
        },
        max_storage_buffer_range: u64::from(limits.max_storage_buffer_range),
        max_push_constants: limits.max_push_constants_size,
        max_workgroup_invocations: limits.max_compute_work_group_invocations,
        max_workgroup_count: limits.max_compute_work_group_count,
        storage_offset_alignment: limits.min_storage_buffer_offset_alignment,
        heaps: heaps(inst, pdev),
        timestamp_period_ns: limits.timestamp_period,
        compute_queue: queue_family.is_some(),
        timestamps: timestamp_bits > 0 && queue_family.is_some(),
        timestamp_bits,
        pci_bus: has_pci.then(|| {
            format!(
                "{:04x}:{:02x}:{:02x}.{:x}",
                ppci.pci_domain, ppci.pci_bus, ppci.pci_device, ppci.pci_function
            )
        }),
        device_uuid: (api >= vk::API_VERSION_1_2).then(|| hex(&p11.device_uuid)),
    };
    Ok(Probe {
        caps,
        queue_family,
        queue_count,
    })
}

/// The compute-unit count a vendor extension reports (queried where exposed), if any.
fn compute_units(
    nv: Option<&vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV>,
    amd: Option<&vk::PhysicalDeviceShaderCorePropertiesAMD>,
) -> Option<u32> {
    let nv = nv.map(|p| p.shader_sm_count);
    let amd = amd.map(|p| {
        p.shader_engine_count * p.shader_arrays_per_engine_count * p.compute_units_per_shader_array
    });
    nv.or(amd).filter(|&n| n > 0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn cstr(s: std::result::Result<&CStr, std::ffi::FromBytesUntilNulError>) -> String {
    s.map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn kind_of(t: vk::PhysicalDeviceType) -> DeviceKind {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => DeviceKind::Discrete,
        vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceKind::Integrated,
        vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceKind::Virtual,
        vk::PhysicalDeviceType::CPU => DeviceKind::Cpu,
        _ => DeviceKind::Other,
    }
}

fn subgroup_caps(
    p11: &vk::PhysicalDeviceVulkan11Properties,
    p13: &vk::PhysicalDeviceVulkan13Properties,
    f13: &vk::PhysicalDeviceVulkan13Features,
    v13: bool,
) -> SubgroupCaps {
    use vk::SubgroupFeatureFlags as F;
    let in_compute = p11
        .subgroup_supported_stages
        .contains(vk::ShaderStageFlags::COMPUTE);
    let names = [
        (F::BASIC, "basic"),
        (F::VOTE, "vote"),
        (F::ARITHMETIC, "arithmetic"),
        (F::BALLOT, "ballot"),
        (F::SHUFFLE, "shuffle"),
        (F::SHUFFLE_RELATIVE, "shuffle_relative"),
        (F::CLUSTERED, "clustered"),
        (F::QUAD, "quad"),
    ];
    let ops = names
        .iter()
        .filter(|(flag, _)| in_compute && p11.subgroup_supported_operations.contains(*flag))
        .map(|(_, name)| name.to_string())
        .collect();
    let size_control = v13
        && f13.subgroup_size_control == vk::TRUE
        && p13
            .required_subgroup_size_stages
            .contains(vk::ShaderStageFlags::COMPUTE);
    let (min_size, max_size) = if size_control {
        (p13.min_subgroup_size, p13.max_subgroup_size)
    } else {
        (p11.subgroup_size, p11.subgroup_size)
    };
    SubgroupCaps {
        size: p11.subgroup_size,
        min_size,
        max_size,
        ops,
        size_control,
        full_subgroups: v13 && f13.compute_full_subgroups == vk::TRUE,
    }
}

/// The queue family we submit compute work to, its timestamp valid bits and its queue count:
/// the first compute family with timestamps, else the first compute family.
fn compute_queue(inst: &ash::Instance, pdev: vk::PhysicalDevice) -> (Option<u32>, u32, u32) {
    // SAFETY: read-only query on a valid physical device.
    let families = unsafe { inst.get_physical_device_queue_family_properties(pdev) };
    let compute = |f: &vk::QueueFamilyProperties| f.queue_flags.contains(vk::QueueFlags::COMPUTE);
    let pick = families
        .iter()
        .position(|f| compute(f) && f.timestamp_valid_bits > 0)
        .or_else(|| families.iter().position(compute));
    match pick {
        Some(i) => (
            Some(i as u32),
            families[i].timestamp_valid_bits,
            families[i].queue_count,
        ),
        None => (None, 0, 0),
    }
}

fn heaps(inst: &ash::Instance, pdev: vk::PhysicalDevice) -> Vec<Heap> {
    // SAFETY: read-only query on a valid physical device.
    let mem = unsafe { inst.get_physical_device_memory_properties(pdev) };
    mem.memory_heaps_as_slice()
        .iter()
        .map(|h| Heap {
            size: h.size,
            device_local: h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL),
        })
        .collect()
}

fn coopmat_shapes(instance: &Instance, pdev: vk::PhysicalDevice) -> Result<Vec<CoopMatShape>> {
    let loader = khr::cooperative_matrix::Instance::new(&instance.entry, &instance.raw);
    // SAFETY: only called when the device exposes VK_KHR_cooperative_matrix.
    let props = unsafe { loader.get_physical_device_cooperative_matrix_properties(pdev) }
        .map_err(vk_err("vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"))?;
    Ok(props
        .iter()
        .map(|p| CoopMatShape {
            m: p.m_size,
            n: p.n_size,
            k: p.k_size,
            a: component_name(p.a_type),
            b: component_name(p.b_type),
            c: component_name(p.c_type),
            result: component_name(p.result_type),
            saturating: p.saturating_accumulation == vk::TRUE,
            scope: scope_name(p.scope),
        })
        .collect())
}

fn component_name(t: vk::ComponentTypeKHR) -> String {
    let name = match t.as_raw() {
        0 => "f16",
        1 => "f32",
        2 => "f64",
        3 => "i8",
        4 => "i16",
        5 => "i32",
        6 => "i64",
        7 => "u8",
        8 => "u16",
        9 => "u32",
        10 => "u64",
        // Values from later extensions (VK_KHR_shader_bfloat16, VK_EXT_shader_float8).
        1_000_141_000 => "bf16",
        1_000_491_002 => "e4m3",
        1_000_491_003 => "e5m2",
        raw => return format!("type{raw}"),
    };
    name.to_string()
}

fn scope_name(s: vk::ScopeKHR) -> String {
    match s {
        vk::ScopeKHR::SUBGROUP => "subgroup".into(),
        vk::ScopeKHR::WORKGROUP => "workgroup".into(),
        vk::ScopeKHR::DEVICE => "device".into(),
        vk::ScopeKHR::QUEUE_FAMILY => "queue_family".into(),
        other => format!("scope{}", other.as_raw()),
    }
}
