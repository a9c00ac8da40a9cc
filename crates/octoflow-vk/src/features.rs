//! Creates the logical device with every feature the device has that our kernels use.

use std::ffi::c_char;

use ash::vk;

use crate::caps::DeviceCaps;
use crate::error::{vk_err, Result};
use crate::instance::Instance;
use crate::probe::{COOPMAT_EXT, PIPELINE_EXEC_EXT};

/// Creates a device with `queue_count` (≥ 1) compute queues from `family`, enabling (when `caps` says they exist)
/// 8/16-bit storage, float16/int8/int16 arithmetic, subgroup size control, integer dot product,
/// buffer device address, timeline semaphores, the Vulkan memory model and cooperative matrices.
pub(crate) fn create_device(
    instance: &Instance,
    pdev: vk::PhysicalDevice,
    family: u32,
    queue_count: u32,
    caps: &DeviceCaps,
) -> Result<ash::Device> {
    let v12 = caps.api_version_raw.min(instance.api_version) >= vk::API_VERSION_1_2;
    let v13 = caps.api_version_raw.min(instance.api_version) >= vk::API_VERSION_1_3;
    let b = |x: bool| if x { vk::TRUE } else { vk::FALSE };

    let core = vk::PhysicalDeviceFeatures::default().shader_int16(caps.shader_int16);
    let mut f11 = vk::PhysicalDeviceVulkan11Features::default()
        .storage_buffer16_bit_access(caps.storage_16bit);
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
        .shader_float16(caps.shader_float16)
        .shader_int8(caps.shader_int8)
        .storage_buffer8_bit_access(caps.storage_8bit)
        .buffer_device_address(caps.buffer_device_address)
        .timeline_semaphore(caps.timeline_semaphore)
        .vulkan_memory_model(caps.vulkan_memory_model);
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default()
        .subgroup_size_control(caps.subgroup.size_control)
        .compute_full_subgroups(caps.subgroup.full_subgroups)
        .shader_integer_dot_product(caps.integer_dot_product);
    let mut fcm = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR {
        cooperative_matrix: b(caps.cooperative_matrix.is_some()),
        ..Default::default()
    };
    let mut fpe = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR {
        pipeline_executable_info: vk::TRUE,
        ..Default::default()
    };
    let mut features = vk::PhysicalDeviceFeatures2::default().features(core);
    if v12 {
        features = features.push_next(&mut f11).push_next(&mut f12);
    }
    if v13 {
        features = features.push_next(&mut f13);
    }
    let mut extensions: Vec<*const c_char> = Vec::new();
    if caps.cooperative_matrix.is_some() {
        features = features.push_next(&mut fcm);
        extensions.push(COOPMAT_EXT.as_ptr());
    }
    if caps.pipeline_statistics {
        features = features.push_next(&mut fpe);
        extensions.push(PIPELINE_EXEC_EXT.as_ptr());
    }

    let priorities = vec![1.0f32; queue_count.max(1) as usize];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&priorities)];
    let info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&extensions)
        .push_next(&mut features);
    // SAFETY: every enabled feature was reported supported by the probe; the chained structs
    // live across the call.
    unsafe { instance.raw.create_device(pdev, &info, None) }.map_err(vk_err("vkCreateDevice"))
}
