//! Device selection and the shared device state every resource holds on to.

use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};
use gpu_allocator::{AllocationSizes, AllocatorDebugSettings};

use crate::caps::{DeviceCaps, DeviceKind};
use crate::error::{vk_err, Result, VkError};
use crate::features::create_device;
use crate::instance::Instance;
use crate::pipeline_cache::{self, CacheIdentity, CacheLoad};
use crate::probe::{probe, Probe};
use crate::transfer::Transfer;

/// Environment variable that selects a device by index (as listed by `octoflow devices`).
pub const GPU_ENV: &str = "OCTOFLOW_GPU";

/// Which device to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// `OCTOFLOW_GPU` if set, else the best device: discrete > integrated > virtual > CPU, ties
    /// broken by device-local memory.
    #[default]
    Auto,
    /// The device at this enumeration index (e.g. from `--gpu N`); overrides `OCTOFLOW_GPU`.
    Index(usize),
}

/// Lists every physical device with its capabilities, in enumeration order.
pub fn list_devices() -> Result<Vec<DeviceCaps>> {
    let instance = Instance::shared()?;
    let probes = enumerate(&instance)?;
    Ok(probes.into_iter().map(|(_, p)| p.caps).collect())
}

fn enumerate(instance: &Instance) -> Result<Vec<(vk::PhysicalDevice, Probe)>> {
    // SAFETY: read-only query on a live instance.
    let pdevs = unsafe { instance.raw.enumerate_physical_devices() }
        .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    pdevs
        .into_iter()
        .enumerate()
        .map(|(i, pdev)| Ok((pdev, probe(instance, pdev, i)?)))
        .collect()
}

/// Why a device cannot run our kernels, or `None` when it can.
fn unusable(caps: &DeviceCaps) -> Option<String> {
    if caps.api_version_raw < vk::API_VERSION_1_2 {
        Some(format!("Vulkan {} < 1.2", caps.api_version))
    } else if !caps.compute_queue {
        Some("no compute queue".into())
    } else {
        None
    }
}

/// The index [`Context::new`] opens for `choice` among `devices` (as from [`list_devices`]),
/// honouring `OCTOFLOW_GPU`.
pub fn choose_device(devices: &[DeviceCaps], choice: DeviceChoice) -> Result<usize> {
    let summary: Vec<_> = devices
        .iter()
        .map(|c| (c.kind, c.device_local_bytes(), unusable(c)))
        .collect();
    let env = std::env::var(GPU_ENV).ok();
    select(&summary, choice, env.as_deref())
}

/// Picks a device index from the probed list: an explicit index, `OCTOFLOW_GPU` (`env`), or
/// the best usable device.
pub(crate) fn select(
    devices: &[(DeviceKind, u64, Option<String>)],
    choice: DeviceChoice,
    env: Option<&str>,
) -> Result<usize> {
    let count = devices.len();
    if count == 0 {
        return Err(VkError::NoDevice);
    }
    let explicit = match (choice, env) {
        (DeviceChoice::Index(i), _) => Some((i, "--gpu".to_string())),
        (DeviceChoice::Auto, Some(v)) => {
            let i = v
                .trim()
                .parse()
                .map_err(|_| VkError::BadDeviceEnv { value: v.into() })?;
            Some((i, format!("{GPU_ENV}={v}")))
        }
        (DeviceChoice::Auto, None) => None,
    };
    if let Some((index, source_of)) = explicit {
        return if index < count {
            Ok(index)
        } else {
            Err(VkError::NoSuchDevice {
                index,
                count,
                source_of,
            })
        };
    }
    devices
        .iter()
        .enumerate()
        .filter(|(_, (_, _, why))| why.is_none())
        .min_by_key(|(_, (kind, local, _))| (*kind, std::cmp::Reverse(*local)))
        .map(|(i, _)| i)
        .ok_or(VkError::NoDevice)
}

/// Compute queues opened at most (when the compute family has that many): enough for a few
/// concurrent training runs or chains to overlap on the device.
pub const MAX_QUEUES: usize = 4;

/// The device state shared by every resource (`Arc`), so the device outlives them all.
pub(crate) struct DeviceInner {
    pub instance: Arc<Instance>,
    pub device: ash::Device,
    /// The compute queues (at least one); queue 0 also serves transfers.
    pub queues: Vec<Mutex<vk::Queue>>,
    pub queue_family: u32,
    pub caps: DeviceCaps,
    pub allocator: ManuallyDrop<Mutex<Allocator>>,
    pub pipeline_cache: vk::PipelineCache,
    /// Where [`Context::save_pipeline_cache`] writes the cache (`None`: not kept on disk).
    pub pipeline_cache_file: Option<PathBuf>,
    /// How the cache's initial data was found.
    pub pipeline_cache_load: CacheLoad,
    /// Pipelines created on this device so far.
    pub pipelines_built: AtomicU64,
    pub transfer: ManuallyDrop<Mutex<Transfer>>,
}

impl DeviceInner {
    /// The allocator, even if a panicking thread poisoned its lock (its state stays consistent).
    pub fn allocator(&self) -> MutexGuard<'_, Allocator> {
        self.allocator.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue 0, locked for a submit.
    pub fn queue(&self) -> MutexGuard<'_, vk::Queue> {
        self.queue_at(0)
    }

    /// Queue `i` modulo the queue count, locked for a submit.
    pub fn queue_at(&self, i: usize) -> MutexGuard<'_, vk::Queue> {
        self.queues[i % self.queues.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: every resource holds an Arc to this, so all are destroyed; wait for the queue
        // anyway in case a submit is still running, then tear down in reverse creation order.
        unsafe {
            let _ = self.device.device_wait_idle();
            ManuallyDrop::drop(&mut self.transfer);
            self.device
                .destroy_pipeline_cache(self.pipeline_cache, None);
            ManuallyDrop::drop(&mut self.allocator);
            self.device.destroy_device(None);
        }
    }
}

/// An open device: the handle every buffer, pipeline and chain is created from. Cloning is
/// cheap (one `Arc`).
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<DeviceInner>,
}

impl Context {
    /// Opens the chosen device with up to [`MAX_QUEUES`] queues of its compute family and every
    /// feature we use that it has.
    pub fn new(choice: DeviceChoice) -> Result<Self> {
        Self::choose_and_open(choice, None)
    }

    /// [`Context::new`] with the pipeline cache kept in `dir` (one file per device and driver,
    /// see [`CacheLoad`]): compiled pipelines of an earlier run are reused, and
    /// [`Context::save_pipeline_cache`] writes them back. A missing, unreadable or foreign file
    /// leaves the cache empty (with a warning), never an error.
    pub fn with_pipeline_cache(choice: DeviceChoice, dir: &Path) -> Result<Self> {
        Self::choose_and_open(choice, Some(dir))
    }

    fn choose_and_open(choice: DeviceChoice, cache_dir: Option<&Path>) -> Result<Self> {
        let instance = Instance::shared()?;
        let mut probes = enumerate(&instance)?;
        let caps: Vec<DeviceCaps> = probes.iter().map(|(_, p)| p.caps.clone()).collect();
        let index = choose_device(&caps, choice)?;
        let (pdev, probe) = probes.swap_remove(index);
        if let Some(reason) = unusable(&probe.caps) {
            return Err(VkError::Unsupported {
                device: probe.caps.name,
                reason,
            });
        }
        let family = probe.queue_family.ok_or_else(|| VkError::Unsupported {
            device: probe.caps.name.clone(),
            reason: "no compute queue".into(),
        })?;
        let queues = (probe.queue_count as usize).clamp(1, MAX_QUEUES) as u32;
        Self::open(instance, pdev, family, queues, probe.caps, cache_dir)
    }

    fn open(
        instance: Arc<Instance>,
        pdev: vk::PhysicalDevice,
        family: u32,
        queue_count: u32,
        caps: DeviceCaps,
        cache_dir: Option<&Path>,
    ) -> Result<Self> {
        let device = create_device(&instance, pdev, family, queue_count, &caps)?;
        // SAFETY: the queue family was requested with `queue_count` queues at device creation.
        let queues = (0..queue_count)
            .map(|i| Mutex::new(unsafe { device.get_device_queue(family, i) }))
            .collect();
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: instance.raw.clone(),
            device: device.clone(),
            physical_device: pdev,
            debug_settings: AllocatorDebugSettings::default(),
            buffer_device_address: caps.buffer_device_address,
            // 8 MiB device and 4 MiB host blocks (the default is 256 MiB; gpu-allocator takes
            // 4 MiB at least): larger buffers (weights, activations) get memory of their own
            // size, small ones share blocks, so the reserve stays near what is used
            allocation_sizes: AllocationSizes::new(8 << 20, 4 << 20),
        })
        .map_err(|e| VkError::Allocator {
            what: "allocator".into(),
            detail: e.to_string(),
        });
        let allocator = match allocator {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: nothing was created from the device yet.
                unsafe { device.destroy_device(None) };
                return Err(e);
            }
        };
        let (cache, cache_file, cache_load) =
            create_pipeline_cache(&instance, pdev, &device, cache_dir);
        if matches!(cache_load, CacheLoad::Rejected { .. }) {
            tracing::warn!("{cache_load}");
        } else {
            tracing::info!("{cache_load}");
        }
        let transfer = cache
            .map_err(vk_err("vkCreatePipelineCache"))
            .and_then(|cache| {
                Transfer::new(&device, family)
                    .map(|t| (cache, t))
                    .inspect_err(|_| unsafe {
                        device.destroy_pipeline_cache(cache, None);
                    })
            });
        let (pipeline_cache, transfer) = match transfer {
            Ok(x) => x,
            Err(e) => {
                drop(allocator);
                // SAFETY: the allocator (the only child) is gone.
                unsafe { device.destroy_device(None) };
                return Err(e);
            }
        };
        tracing::info!(
            "opened Vulkan device {:?} ({}) with {queue_count} compute queue(s)",
            caps.name,
            caps.driver_info
        );
        let inner = DeviceInner {
            instance,
            device,
            queues,
            queue_family: family,
            caps,
            allocator: ManuallyDrop::new(Mutex::new(allocator)),
            pipeline_cache,
            pipeline_cache_file: cache_file,
            pipeline_cache_load: cache_load,
            pipelines_built: AtomicU64::new(0),
            transfer: ManuallyDrop::new(Mutex::new(transfer)),
        };
        Ok(Context {
            inner: Arc::new(inner),
        })
    }

    /// The device's capabilities (what variant choices are based on).
    pub fn caps(&self) -> &DeviceCaps {
        &self.inner.caps
    }

    /// Validation-layer errors reported so far (0 without `OCTOFLOW_VALIDATION=1`).
    pub fn validation_errors(&self) -> u64 {
        self.inner.instance.validation_errors()
    }

    /// Whether the Khronos validation layer is active (`OCTOFLOW_VALIDATION=1`).
    pub fn validation_enabled(&self) -> bool {
        self.inner.instance.validation_enabled()
    }

    /// Bytes of live buffer allocations, and bytes of device memory reserved for them (blocks
    /// and dedicated allocations): what the process holds on the device.
    pub fn memory_usage(&self) -> (u64, u64) {
        let report = self.inner.allocator().generate_report();
        (report.total_allocated_bytes, report.total_capacity_bytes)
    }

    /// Compute queues this context opened (1 ..= [`MAX_QUEUES`]). Chains submit to queue 0
    /// unless [`crate::Chain::set_queue`] picks another; work on different queues may overlap.
    pub fn queue_count(&self) -> usize {
        self.inner.queues.len()
    }

    /// How the pipeline cache's initial data was found (see [`Context::with_pipeline_cache`]).
    pub fn pipeline_cache_load(&self) -> &CacheLoad {
        &self.inner.pipeline_cache_load
    }

    /// Pipelines created on this device so far: what a warm-up is checked by (after it, serving
    /// should build none).
    pub fn pipelines_built(&self) -> u64 {
        self.inner.pipelines_built.load(Ordering::Relaxed)
    }

    /// Writes the pipeline cache to its file (atomically) when the context keeps it on disk and
    /// it changed since it was read; returns the file and its size when it wrote.
    pub fn save_pipeline_cache(&self) -> Result<Option<(PathBuf, usize)>> {
        let Some(path) = &self.inner.pipeline_cache_file else {
            return Ok(None);
        };
        // SAFETY: the cache is live and internally synchronized.
        let data = unsafe {
            self.inner
                .device
                .get_pipeline_cache_data(self.inner.pipeline_cache)
        }
        .map_err(vk_err("vkGetPipelineCacheData"))?;
        let wrote = pipeline_cache::save(path, &data)?;
        Ok(wrote.then(|| (path.clone(), data.len())))
    }

    /// Blocks until the device is idle.
    pub fn wait_idle(&self) -> Result<()> {
        let _queues: Vec<_> = (0..self.queue_count())
            .map(|i| self.inner.queue_at(i))
            .collect();
        // SAFETY: every queue's lock is held (in index order, so two waits cannot deadlock),
        // so no submit races with the wait.
        unsafe { self.inner.device.device_wait_idle() }.map_err(vk_err("vkDeviceWaitIdle"))
    }
}

/// The device's pipeline cache, seeded from its file in `dir` when given (see
/// [`Context::with_pipeline_cache`]): the cache, the file to save it to and how the load went.
fn create_pipeline_cache(
    instance: &Instance,
    pdev: vk::PhysicalDevice,
    device: &ash::Device,
    dir: Option<&Path>,
) -> (
    std::result::Result<vk::PipelineCache, vk::Result>,
    Option<PathBuf>,
    CacheLoad,
) {
    let empty = || {
        // SAFETY: empty initial cache on a live device.
        unsafe { device.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None) }
    };
    let Some(dir) = dir else {
        return (empty(), None, CacheLoad::Off);
    };
    // SAFETY: read-only query of a live physical device.
    let props = unsafe { instance.raw.get_physical_device_properties(pdev) };
    let id = CacheIdentity::of(&props);
    let file = dir.join(id.file_name());
    let (data, load) = pipeline_cache::load(dir, &id);
    if data.is_empty() {
        return (empty(), Some(file), load);
    }
    let info = vk::PipelineCacheCreateInfo::default().initial_data(&data);
    // SAFETY: `data` outlives the call; its header was checked against this device.
    match unsafe { device.create_pipeline_cache(&info, None) } {
        Ok(cache) => (Ok(cache), Some(file), load),
        Err(e) => {
            let reason = format!("the driver refused its data: {e}");
            (
                empty(),
                Some(file.clone()),
                CacheLoad::Rejected { path: file, reason },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(kind: DeviceKind, local: u64) -> (DeviceKind, u64, Option<String>) {
        (kind, local, None)
    }

    #[test]
    fn auto_prefers_discrete_then_integrated_then_cpu() {
        let list = [
            dev(DeviceKind::Cpu, 1 << 30),
            dev(DeviceKind::Integrated, 1 << 30),
            dev(DeviceKind::Discrete, 1 << 20),
        ];
        assert_eq!(select(&list, DeviceChoice::Auto, None).unwrap(), 2);
        assert_eq!(select(&list[..2], DeviceChoice::Auto, None).unwrap(), 1);
    }

    #[test]
    fn auto_breaks_ties_by_device_memory_and_skips_unusable() {
        let mut list = vec![
            dev(DeviceKind::Discrete, 8 << 30),
            dev(DeviceKind::Discrete, 80 << 30),
        ];
        assert_eq!(select(&list, DeviceChoice::Auto, None).unwrap(), 1);
        list[1].2 = Some("Vulkan 1.1 < 1.2".into());
        assert_eq!(select(&list, DeviceChoice::Auto, None).unwrap(), 0);
    }

    #[test]
    fn env_and_explicit_index_override_auto() {
        let list = [dev(DeviceKind::Discrete, 1), dev(DeviceKind::Cpu, 1)];
        assert_eq!(select(&list, DeviceChoice::Auto, Some("1")).unwrap(), 1);
        assert_eq!(select(&list, DeviceChoice::Index(0), Some("1")).unwrap(), 0);
    }

    #[test]
    fn bad_index_or_env_is_a_clear_error() {
        let list = [dev(DeviceKind::Cpu, 1)];
        let err = select(&list, DeviceChoice::Index(3), None).unwrap_err();
        assert!(
            matches!(
                err,
                VkError::NoSuchDevice {
                    index: 3,
                    count: 1,
                    ..
                }
            ),
            "{err}"
        );
        let err = select(&list, DeviceChoice::Auto, Some("gpu0")).unwrap_err();
        assert!(matches!(err, VkError::BadDeviceEnv { .. }), "{err}");
        assert!(matches!(
            select(&[], DeviceChoice::Auto, None),
            Err(VkError::NoDevice)
        ));
    }
}
