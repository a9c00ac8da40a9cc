use crate::testing::{assert_no_validation_errors, gpu_or_skip};
use crate::{list_devices, Context, DeviceChoice, VkError};

#[test]
fn listing_reports_every_device_with_the_capabilities_kernels_choose_by() {
    let Some(ctx) = gpu_or_skip("listing_reports_every_device") else {
        return;
    };
    let devices = list_devices().unwrap();
    assert!(!devices.is_empty());
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.index, i);
        assert!(!d.name.is_empty() && !d.api_version.is_empty());
        assert!(
            d.subgroup.size >= 1 && d.subgroup.min_size <= d.subgroup.max_size,
            "{d:?}"
        );
        assert!(
            d.max_storage_buffer_range > 0 && d.max_shared_memory >= 16 * 1024,
            "{d:?}"
        );
        assert!(
            !d.heaps.is_empty() && d.max_workgroup_invocations >= 128,
            "{d:?}"
        );
        let json = serde_json::to_value(d).unwrap();
        assert!(json["subgroup"]["ops"].is_array() && json["name"].is_string());
    }
    let opened = ctx.caps();
    assert!(devices.iter().any(|d| d.name == opened.name));
    assert!(
        opened.max_allocation > 0,
        "a Vulkan 1.2 device reports maxMemoryAllocationSize"
    );
    assert_no_validation_errors(&ctx);
}

#[test]
fn explicit_device_index_out_of_range_is_a_clear_error() {
    let Some(_ctx) = gpu_or_skip("explicit_device_index_out_of_range") else {
        return;
    };
    let count = list_devices().unwrap().len();
    let err = Context::new(DeviceChoice::Index(count + 5)).err().unwrap();
    assert!(matches!(err, VkError::NoSuchDevice { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("only {count} device")),
        "{err}"
    );
}

#[test]
fn validation_layer_is_active_when_requested() {
    let Some(ctx) = gpu_or_skip("validation_layer_is_active_when_requested") else {
        return;
    };
    let requested = std::env::var(crate::VALIDATION_ENV).is_ok_and(|v| v == "1");
    if requested {
        // The layer is installed where CI requests it (vulkan-validationlayers).
        assert!(
            ctx.validation_enabled(),
            "{}=1 but the validation layer is not active",
            crate::VALIDATION_ENV
        );
    } else {
        assert!(!ctx.validation_enabled());
    }
}
