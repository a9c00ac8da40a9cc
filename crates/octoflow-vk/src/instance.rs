//! The Vulkan loader and instance, with optional validation layers.

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ash::{ext, vk};

use crate::error::{vk_err, Result, VkError};

const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Environment variable that turns on the Khronos validation layer (`1`), when it is installed.
pub const VALIDATION_ENV: &str = "OCTOFLOW_VALIDATION";

/// A loaded Vulkan library and an instance. Shared (`Arc`) by every device created from it.
pub struct Instance {
    pub(crate) entry: ash::Entry,
    pub(crate) raw: ash::Instance,
    /// Vulkan API version the instance was created for.
    pub(crate) api_version: u32,
    debug: Option<(ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    /// Validation errors reported so far (boxed so the callback's pointer stays put).
    validation_errors: Box<AtomicU64>,
}

/// The process-wide instance, made on first use and kept until the process exits.
static SHARED: Mutex<Option<Arc<Instance>>> = Mutex::new(None);

impl Instance {
    /// The process's instance, created on first use. One instance per process, never destroyed:
    /// NVIDIA's driver deadlocks when instances are created and destroyed concurrently (seen
    /// with parallel tests on the H100), and the loader is process-global state anyway.
    pub fn shared() -> Result<Arc<Self>> {
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(instance) = shared.as_ref() {
            return Ok(instance.clone());
        }
        let instance = Self::new()?;
        *shared = Some(instance.clone());
        Ok(instance)
    }

    /// Loads `libvulkan` and creates an instance. Validation is on when `OCTOFLOW_VALIDATION=1`
    /// and the layer is installed.
    fn new() -> Result<Arc<Self>> {
        // SAFETY: loading the system Vulkan loader runs its initializers; that is its contract.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| VkError::NoLoader(e.to_string()))?;
        // SAFETY: plain query on a loaded entry.
        let loader_version = unsafe { entry.try_enumerate_instance_version() }
            .map_err(vk_err("vkEnumerateInstanceVersion"))?
            .unwrap_or(vk::API_VERSION_1_0);
        let api_version = loader_version.min(vk::API_VERSION_1_3);
        let want_validation = std::env::var(VALIDATION_ENV).is_ok_and(|v| v == "1");
        let validation = want_validation && layer_present(&entry)?;
        if want_validation && !validation {
            tracing::warn!("{VALIDATION_ENV}=1 but {VALIDATION_LAYER:?} is not installed");
        }

        let app = vk::ApplicationInfo::default()
            .application_name(c"octoflow")
            .engine_name(c"octoflow")
            .api_version(api_version);
        let layers = [VALIDATION_LAYER.as_ptr()];
        let exts = [ext::debug_utils::NAME.as_ptr()];
        let mut info = vk::InstanceCreateInfo::default().application_info(&app);
        if validation {
            info = info
                .enabled_layer_names(&layers)
                .enabled_extension_names(&exts);
        }
        // SAFETY: create info and the arrays it points to live across the call.
        let raw = unsafe { entry.create_instance(&info, None) }.map_err(|e| match e {
            // The loader's answer when it finds no driver (ICD) at all.
            vk::Result::ERROR_INCOMPATIBLE_DRIVER => VkError::NoDevice,
            e => vk_err("vkCreateInstance")(e),
        })?;
        let validation_errors = Box::new(AtomicU64::new(0));
        let mut instance = Instance {
            entry,
            raw,
            api_version,
            debug: None,
            validation_errors,
        };
        if validation {
            instance.install_messenger()?;
        }
        Ok(Arc::new(instance))
    }

    /// Number of validation-layer errors reported since the instance was created (0 without
    /// validation).
    pub fn validation_errors(&self) -> u64 {
        self.validation_errors.load(Ordering::Relaxed)
    }

    /// Whether the validation layer is active.
    pub fn validation_enabled(&self) -> bool {
        self.debug.is_some()
    }

    fn install_messenger(&mut self) -> Result<()> {
        let loader = ext::debug_utils::Instance::new(&self.entry, &self.raw);
        let counter: *const AtomicU64 = &*self.validation_errors;
        let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(
                vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                    | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
            )
            .message_type(
                vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                    | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
            )
            .pfn_user_callback(Some(on_validation_message))
            .user_data(counter as *mut c_void);
        // SAFETY: the counter is boxed and outlives the messenger (destroyed first in Drop).
        let messenger = unsafe { loader.create_debug_utils_messenger(&info, None) }
            .map_err(vk_err("vkCreateDebugUtilsMessengerEXT"))?;
        self.debug = Some((loader, messenger));
        Ok(())
    }
}

fn layer_present(entry: &ash::Entry) -> Result<bool> {
    // SAFETY: plain query on a loaded entry.
    let layers = unsafe { entry.enumerate_instance_layer_properties() }
        .map_err(vk_err("vkEnumerateInstanceLayerProperties"))?;
    Ok(layers
        .iter()
        .any(|l| l.layer_name_as_c_str() == Ok(VALIDATION_LAYER)))
}

unsafe extern "system" fn on_validation_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    // SAFETY: the layer passes valid callback data; `user` is the instance's boxed counter.
    let message = unsafe { data.as_ref().and_then(|d| d.message_as_c_str()) }
        .map(|m| m.to_string_lossy().into_owned())
        .unwrap_or_default();
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        if let Some(counter) = unsafe { (user as *const AtomicU64).as_ref() } {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        tracing::error!(target: "vulkan", "{message}");
    } else {
        tracing::warn!(target: "vulkan", "{message}");
    }
    vk::FALSE
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: every device made from this instance holds an Arc to it and is gone by now.
        unsafe {
            if let Some((loader, messenger)) = self.debug.take() {
                loader.destroy_debug_utils_messenger(messenger, None);
            }
            self.raw.destroy_instance(None);
        }
    }
}
