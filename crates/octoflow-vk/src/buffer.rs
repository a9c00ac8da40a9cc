//! GPU buffers (RAII) and slices of them for binding.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use ash::vk;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};
use gpu_allocator::{AllocationError, MemoryLocation};

use crate::context::{Context, DeviceInner};
use crate::error::{vk_err, Result, VkError};
use crate::plain::{as_bytes, as_bytes_mut, Plain};

/// Buffers at least this large get their own `VkDeviceMemory` (weights, KV cache): no
/// fragmentation of the shared blocks and the driver may place them better.
const DEDICATED_FROM: u64 = 32 << 20;

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Device-local (VRAM); written by transfers and shaders. Mapped anyway on unified-memory
    /// devices such as lavapipe, where uploads then skip the staging copy.
    DeviceLocal,
    /// Host-visible and coherent, written by the CPU and read by the GPU: staging and small
    /// control buffers (device-local too when the device has such memory).
    Upload,
    /// Host-visible, coherent and cached: GPU results the CPU reads back.
    Readback,
}

/// A storage buffer with its memory. Cloning shares it (`Arc`); the memory is freed when the
/// last clone (including those held by recorded chains) is dropped.
#[derive(Clone)]
pub struct Buffer {
    pub(crate) inner: Arc<BufferInner>,
}

pub(crate) struct BufferInner {
    pub dev: Arc<DeviceInner>,
    pub raw: vk::Buffer,
    allocation: Mutex<Option<Allocation>>,
    mapped: Option<MappedPtr>,
    size: u64,
    name: String,
    kind: MemoryKind,
}

/// The host address of a mapped allocation; it stays valid until the allocation is freed.
#[derive(Clone, Copy)]
struct MappedPtr(NonNull<u8>);
// SAFETY: the pointer is into coherent mapped memory owned by the buffer; accesses go through
// `Buffer::write`/`read`, which copy bytes (the GPU may access it concurrently, as Vulkan allows).
unsafe impl Send for MappedPtr {}
unsafe impl Sync for MappedPtr {}

impl Buffer {
    /// Allocates `size` bytes named `name` (the name appears in errors and allocator reports).
    /// Usage: storage, transfer source/destination and indirect-dispatch arguments.
    pub fn new(ctx: &Context, name: &str, size: u64, kind: MemoryKind) -> Result<Self> {
        let dev = &ctx.inner;
        check_size(ctx, name, size)?;
        let mut usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST
            | vk::BufferUsageFlags::INDIRECT_BUFFER;
        if dev.caps.buffer_device_address {
            usage |= vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS;
        }
        let info = vk::BufferCreateInfo::default().size(size).usage(usage);
        // SAFETY: valid create info on a live device.
        let raw =
            unsafe { dev.device.create_buffer(&info, None) }.map_err(vk_err("vkCreateBuffer"))?;
        match allocate(dev, name, raw, kind) {
            Ok(allocation) => {
                // Only coherent memory is written directly: no flush/invalidate bookkeeping.
                let coherent = allocation
                    .memory_properties()
                    .contains(vk::MemoryPropertyFlags::HOST_COHERENT);
                let mapped = allocation
                    .mapped_ptr()
                    .filter(|_| coherent)
                    .map(|p| MappedPtr(p.cast()));
                let inner = BufferInner {
                    dev: dev.clone(),
                    raw,
                    allocation: Mutex::new(Some(allocation)),
                    mapped,
                    size,
                    name: name.to_string(),
                    kind,
                };
                Ok(Buffer {
                    inner: Arc::new(inner),
                })
            }
            Err(e) => {
                // SAFETY: the buffer was never bound or used.
                unsafe { dev.device.destroy_buffer(raw, None) };
                Err(e)
            }
        }
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    /// The name given at creation.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Where it lives.
    pub fn kind(&self) -> MemoryKind {
        self.inner.kind
    }

    /// Whether the CPU can read and write it directly ([`Buffer::write`], [`Buffer::read`]).
    pub fn is_mapped(&self) -> bool {
        self.inner.mapped.is_some()
    }

    /// The raw handle (for code that records its own Vulkan commands).
    pub fn raw(&self) -> vk::Buffer {
        self.inner.raw
    }

    /// The whole buffer as a binding.
    pub fn whole(&self) -> BufferSlice {
        BufferSlice {
            buffer: self.clone(),
            offset: 0,
            size: self.inner.size,
        }
    }

    /// `size` bytes from `offset` as a binding; checked against the buffer's size.
    pub fn slice(&self, offset: u64, size: u64) -> Result<BufferSlice> {
        self.check_range(offset, size)?;
        Ok(BufferSlice {
            buffer: self.clone(),
            offset,
            size,
        })
    }

    /// Copies `data` into a mapped buffer at byte `offset`. The GPU must not be using that
    /// range (write between submits, e.g. a control buffer's step values).
    pub fn write<T: Plain>(&self, offset: u64, data: &[T]) -> Result<()> {
        let bytes = as_bytes(data);
        let ptr = self.mapped_range(offset, bytes.len() as u64)?;
        // SAFETY: the range is inside the mapped allocation (checked above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        Ok(())
    }

    /// Copies from a mapped buffer at byte `offset` into `out`, after the GPU work writing it
    /// has completed.
    pub fn read<T: Plain>(&self, offset: u64, out: &mut [T]) -> Result<()> {
        let bytes = as_bytes_mut(out);
        let ptr = self.mapped_range(offset, bytes.len() as u64)?;
        // SAFETY: the range is inside the mapped allocation (checked above).
        unsafe { std::ptr::copy_nonoverlapping(ptr, bytes.as_mut_ptr(), bytes.len()) };
        Ok(())
    }

    fn mapped_range(&self, offset: u64, len: u64) -> Result<*mut u8> {
        let base = self.inner.mapped.ok_or_else(|| VkError::NotMapped {
            what: self.inner.name.clone(),
        })?;
        self.check_range(offset, len)?;
        // SAFETY: offset is within the allocation (checked), which is at least `size` long.
        Ok(unsafe { base.0.as_ptr().add(offset as usize) })
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.size => Ok(()),
            _ => Err(VkError::BadRange {
                what: self.inner.name.clone(),
                detail: format!("range {offset}+{len} outside its {} bytes", self.inner.size),
            }),
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Buffer({:?}, {} bytes, {:?})",
            self.inner.name, self.inner.size, self.inner.kind
        )
    }
}

fn check_size(ctx: &Context, name: &str, size: u64) -> Result<()> {
    let caps = ctx.caps();
    if size == 0 {
        return Err(VkError::EmptyBuffer { what: name.into() });
    }
    if caps.max_allocation > 0 && size > caps.max_allocation {
        let (limit_name, limit) = ("maxMemoryAllocationSize", caps.max_allocation);
        return Err(VkError::BufferTooLarge {
            what: name.into(),
            requested: size,
            limit_name,
            limit,
        });
    }
    if size > caps.max_storage_buffer_range {
        let (limit_name, limit) = ("maxStorageBufferRange", caps.max_storage_buffer_range);
        return Err(VkError::BufferTooLarge {
            what: name.into(),
            requested: size,
            limit_name,
            limit,
        });
    }
    Ok(())
}

fn allocate(
    dev: &DeviceInner,
    name: &str,
    raw: vk::Buffer,
    kind: MemoryKind,
) -> Result<Allocation> {
    // SAFETY: `raw` is a live buffer of this device.
    let requirements = unsafe { dev.device.get_buffer_memory_requirements(raw) };
    let location = match kind {
        MemoryKind::DeviceLocal => MemoryLocation::GpuOnly,
        MemoryKind::Upload => MemoryLocation::CpuToGpu,
        MemoryKind::Readback => MemoryLocation::GpuToCpu,
    };
    let allocation_scheme = if requirements.size >= DEDICATED_FROM {
        AllocationScheme::DedicatedBuffer(raw)
    } else {
        AllocationScheme::GpuAllocatorManaged
    };
    let desc = AllocationCreateDesc {
        name,
        requirements,
        location,
        linear: true,
        allocation_scheme,
    };
    let allocation = dev.allocator().allocate(&desc).map_err(|e| match e {
        AllocationError::OutOfMemory => VkError::OutOfDeviceMemory {
            what: name.into(),
            requested: requirements.size,
            heap_size: dev.caps.heaps.iter().map(|h| h.size).max().unwrap_or(0),
        },
        other => VkError::Allocator {
            what: name.into(),
            detail: other.to_string(),
        },
    })?;
    // SAFETY: fresh allocation sized and typed for this buffer.
    let bound = unsafe {
        dev.device
            .bind_buffer_memory(raw, allocation.memory(), allocation.offset())
    };
    if let Err(e) = bound {
        let _ = dev.allocator().free(allocation);
        return Err(vk_err("vkBindBufferMemory")(e));
    }
    Ok(allocation)
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        // SAFETY: the last reference is gone, so no recorded chain can still use the buffer
        // (chains hold clones until they are dropped, and wait for their fences first).
        unsafe { self.dev.device.destroy_buffer(self.raw, None) };
        let allocation = self
            .allocation
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(allocation) = allocation {
            if let Err(e) = self.dev.allocator().free(allocation) {
                tracing::error!("freeing buffer {:?}: {e}", self.name);
            }
        }
    }
}

/// A byte range of a buffer, bound to one storage-buffer binding of a dispatch.
#[derive(Clone, Debug)]
pub struct BufferSlice {
    pub buffer: Buffer,
    /// Byte offset; must be a multiple of the device's `minStorageBufferOffsetAlignment`.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
}

impl From<&Buffer> for BufferSlice {
    fn from(b: &Buffer) -> Self {
        b.whole()
    }
}
