//! Synchronous transfers between the host and buffers (staging when a buffer is not mapped),
//! and fills. They block until done and must not overlap a running chain that uses the same
//! buffers.

use ash::vk;

use crate::buffer::{Buffer, MemoryKind};
use crate::context::Context;
use crate::error::{vk_err, Result, VkError};
use crate::plain::{as_bytes, as_bytes_mut, Plain};

/// Largest staging buffer one transfer allocates; bigger uploads go through it in pieces.
const STAGING_BYTES: u64 = 64 << 20;

/// A command pool, command buffer and fence for one-shot transfer submissions.
pub(crate) struct Transfer {
    device: ash::Device,
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
}

impl Transfer {
    pub(crate) fn new(device: &ash::Device, family: u32) -> Result<Self> {
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: valid create infos on a live device; partial results are destroyed on error.
        unsafe {
            let pool = device
                .create_command_pool(&info, None)
                .map_err(vk_err("vkCreateCommandPool"))?;
            let alloc = vk::CommandBufferAllocateInfo::default()
                .command_pool(pool)
                .command_buffer_count(1);
            let cmd = match device.allocate_command_buffers(&alloc) {
                Ok(c) => c[0],
                Err(e) => {
                    device.destroy_command_pool(pool, None);
                    return Err(vk_err("vkAllocateCommandBuffers")(e));
                }
            };
            let fence = match device.create_fence(&vk::FenceCreateInfo::default(), None) {
                Ok(f) => f,
                Err(e) => {
                    device.destroy_command_pool(pool, None);
                    return Err(vk_err("vkCreateFence")(e));
                }
            };
            Ok(Transfer {
                device: device.clone(),
                pool,
                cmd,
                fence,
            })
        }
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        // SAFETY: one-shots wait for their fence, so nothing is pending.
        unsafe {
            self.device.destroy_fence(self.fence, None);
            self.device.destroy_command_pool(self.pool, None);
        }
    }
}

impl Context {
    /// Records commands with `record`, submits them and waits for completion.
    pub(crate) fn one_shot(
        &self,
        record: impl FnOnce(&ash::Device, vk::CommandBuffer),
    ) -> Result<()> {
        let dev = &self.inner;
        let t = dev.transfer.lock().unwrap_or_else(|e| e.into_inner());
        let d = &dev.device;
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // SAFETY: the transfer lock gives exclusive use of the command buffer and fence, which
        // are idle (every previous one-shot waited for its fence).
        unsafe {
            d.reset_command_buffer(t.cmd, vk::CommandBufferResetFlags::empty())
                .map_err(vk_err("vkResetCommandBuffer"))?;
            d.begin_command_buffer(t.cmd, &begin)
                .map_err(vk_err("vkBeginCommandBuffer"))?;
            record(d, t.cmd);
            let to_host = vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                .dst_access_mask(vk::AccessFlags::HOST_READ);
            d.cmd_pipeline_barrier(
                t.cmd,
                vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[to_host],
                &[],
                &[],
            );
            d.end_command_buffer(t.cmd)
                .map_err(vk_err("vkEndCommandBuffer"))?;
            let cmds = [t.cmd];
            let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
            {
                let queue = dev.queue();
                d.queue_submit(*queue, &submit, t.fence)
                    .map_err(vk_err("vkQueueSubmit"))?;
            }
            d.wait_for_fences(&[t.fence], true, u64::MAX)
                .map_err(vk_err("vkWaitForFences"))?;
            d.reset_fences(&[t.fence])
                .map_err(vk_err("vkResetFences"))?;
        }
        Ok(())
    }

    /// Copies `data` into `dst` at byte `offset` (directly if mapped, else through staging).
    pub fn upload<T: Plain>(&self, dst: &Buffer, offset: u64, data: &[T]) -> Result<()> {
        let bytes = as_bytes(data);
        dst.check_range(offset, bytes.len() as u64)?;
        if dst.is_mapped() || bytes.is_empty() {
            return dst.write(offset, bytes);
        }
        self.upload_staged(dst, offset, bytes)
    }

    /// The staging path of [`Context::upload`] (range already checked).
    pub(crate) fn upload_staged(&self, dst: &Buffer, offset: u64, bytes: &[u8]) -> Result<()> {
        let staging = self.staging(bytes.len() as u64, MemoryKind::Upload)?;
        for (i, piece) in bytes.chunks(staging.size() as usize).enumerate() {
            staging.write(0, piece)?;
            let region = vk::BufferCopy {
                src_offset: 0,
                dst_offset: offset + (i as u64) * staging.size(),
                size: piece.len() as u64,
            };
            // SAFETY: both buffers are live and the region is inside both (checked above).
            self.one_shot(|d, cmd| unsafe {
                d.cmd_copy_buffer(cmd, staging.raw(), dst.raw(), &[region])
            })?;
        }
        Ok(())
    }

    /// Copies from `src` at byte `offset` into `out` (directly if mapped, else through staging).
    pub fn download<T: Plain>(&self, src: &Buffer, offset: u64, out: &mut [T]) -> Result<()> {
        let bytes = as_bytes_mut(out);
        src.check_range(offset, bytes.len() as u64)?;
        if src.is_mapped() || bytes.is_empty() {
            return src.read(offset, bytes);
        }
        self.download_staged(src, offset, bytes)
    }

    /// The staging path of [`Context::download`] (range already checked).
    pub(crate) fn download_staged(
        &self,
        src: &Buffer,
        offset: u64,
        bytes: &mut [u8],
    ) -> Result<()> {
        let staging = self.staging(bytes.len() as u64, MemoryKind::Readback)?;
        let step = staging.size() as usize;
        for (i, piece) in bytes.chunks_mut(step).enumerate() {
            let region = vk::BufferCopy {
                src_offset: offset + (i * step) as u64,
                dst_offset: 0,
                size: piece.len() as u64,
            };
            // SAFETY: both buffers are live and the region is inside both (checked above).
            self.one_shot(|d, cmd| unsafe {
                d.cmd_copy_buffer(cmd, src.raw(), staging.raw(), &[region])
            })?;
            staging.read(0, piece)?;
        }
        Ok(())
    }

    /// Fills `size` bytes of `dst` from `offset` with the 32-bit pattern `value`; offset and
    /// size must be multiples of 4.
    pub fn fill(&self, dst: &Buffer, offset: u64, size: u64, value: u32) -> Result<()> {
        check_fill(dst, offset, size)?;
        // SAFETY: live buffer, range checked.
        self.one_shot(|d, cmd| unsafe { d.cmd_fill_buffer(cmd, dst.raw(), offset, size, value) })
    }

    /// Copies `size` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
    pub fn copy(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        size: u64,
    ) -> Result<()> {
        src.check_range(src_offset, size)?;
        dst.check_range(dst_offset, size)?;
        let region = vk::BufferCopy {
            src_offset,
            dst_offset,
            size,
        };
        // SAFETY: live buffers, ranges checked.
        self.one_shot(|d, cmd| unsafe { d.cmd_copy_buffer(cmd, src.raw(), dst.raw(), &[region]) })
    }

    fn staging(&self, len: u64, kind: MemoryKind) -> Result<Buffer> {
        let size = len
            .clamp(4, STAGING_BYTES)
            .min(self.caps().max_buffer_bytes());
        Buffer::new(self, "staging", size, kind)
    }
}

/// Checks a fill's range: inside the buffer and 4-byte aligned (a Vulkan requirement).
pub(crate) fn check_fill(dst: &Buffer, offset: u64, size: u64) -> Result<()> {
    dst.check_range(offset, size)?;
    if !offset.is_multiple_of(4) || !size.is_multiple_of(4) {
        return Err(VkError::BadRange {
            what: dst.name().into(),
            detail: format!("fill range {offset}+{size} is not a multiple of 4 bytes"),
        });
    }
    Ok(())
}
