//! Dispatch chains: work recorded once into one command buffer, replayed by `submit` as often
//! as needed. Values that change between replays (position, token, sequence length) live in a
//! control buffer the CPU writes between submits, so the recording itself never changes.
//!
//! Recording methods are in `record.rs`; this file holds the chain's life cycle.

use std::collections::HashSet;

use ash::vk;

use crate::buffer::Buffer;
use crate::context::Context;
use crate::descriptor::DescriptorArena;
use crate::error::{vk_err, Result, VkError};
use crate::pipeline::Pipeline;
use crate::timestamps::{DispatchTime, Timestamps};

/// Where a chain is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Accepting commands.
    Recording,
    /// Recorded and idle; may be submitted.
    Ready,
    /// Submitted; `wait` before reading results or resubmitting.
    Pending,
}

/// A recorded sequence of dispatches, barriers, fills and copies. It holds clones of every
/// buffer and pipeline it uses, so they live as long as the chain.
pub struct Chain {
    pool: vk::CommandPool,
    pub(crate) cmd: vk::CommandBuffer,
    fence: vk::Fence,
    pub(crate) descriptors: DescriptorArena,
    pub(crate) timestamps: Option<Timestamps>,
    /// Start and end timestamps of the whole chain ([`Chain::with_span_timing`]).
    pub(crate) span: Option<crate::span::SpanTimer>,
    pub(crate) state: State,
    pub(crate) keep_buffers: Vec<Buffer>,
    pub(crate) keep_pipelines: Vec<Pipeline>,
    pub(crate) kept: HashSet<u64>,
    pub(crate) bound: Option<vk::Pipeline>,
    pub(crate) dispatches: usize,
    pub(crate) scope: Option<String>,
    pub(crate) gate: Option<crate::gate::Gate>,
    /// Device memory the recorder lends to kernels for their temporaries ([`Chain::lend_scratch`]).
    lent: Option<crate::buffer::BufferSlice>,
    /// Index of the queue `submit` uses (modulo the context's queue count).
    queue: usize,
    /// The host signal the last submit waits for ([`Chain::submit_after`]).
    pub(crate) waits_for: Option<(crate::timeline::Timeline, u64)>,
    /// Last field: dropped after the pools and kept resources above, so the device outlives them.
    pub(crate) ctx: Context,
}

impl Chain {
    /// Starts recording a chain without profiling.
    pub fn new(ctx: &Context) -> Result<Self> {
        Self::create(ctx, false)
    }

    /// Starts recording a chain that times every dispatch with GPU timestamps
    /// ([`Chain::timings`]). Errors on a device without compute-queue timestamps.
    pub fn with_profiling(ctx: &Context) -> Result<Self> {
        if !ctx.caps().timestamps {
            return Err(VkError::NoTimestamps {
                device: ctx.caps().name.clone(),
            });
        }
        Self::create(ctx, true)
    }

    fn create(ctx: &Context, profile: bool) -> Result<Self> {
        let dev = &ctx.inner;
        let d = &dev.device;
        let info = vk::CommandPoolCreateInfo::default().queue_family_index(dev.queue_family);
        // SAFETY: valid create infos on a live device; `Chain`'s Drop releases what was made
        // (null handles are ignored by the destroy calls).
        let pool =
            unsafe { d.create_command_pool(&info, None) }.map_err(vk_err("vkCreateCommandPool"))?;
        let mut chain = Chain {
            pool,
            cmd: vk::CommandBuffer::null(),
            fence: vk::Fence::null(),
            descriptors: DescriptorArena::new(d),
            span: None,
            timestamps: profile.then(|| {
                Timestamps::new(d, ctx.caps().timestamp_period_ns, ctx.caps().timestamp_bits)
            }),
            state: State::Ready,
            keep_buffers: Vec::new(),
            keep_pipelines: Vec::new(),
            kept: HashSet::new(),
            bound: None,
            dispatches: 0,
            scope: None,
            gate: None,
            lent: None,
            queue: 0,
            waits_for: None,
            ctx: ctx.clone(),
        };
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .command_buffer_count(1);
        chain.cmd = unsafe { d.allocate_command_buffers(&alloc) }
            .map_err(vk_err("vkAllocateCommandBuffers"))?[0];
        chain.fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }
            .map_err(vk_err("vkCreateFence"))?;
        // No ONE_TIME_SUBMIT: the point is to replay it.
        let begin = vk::CommandBufferBeginInfo::default();
        unsafe { d.begin_command_buffer(chain.cmd, &begin) }
            .map_err(vk_err("vkBeginCommandBuffer"))?;
        chain.state = State::Recording;
        Ok(chain)
    }

    /// The device this chain records for.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Submits go to queue `i` of the context from now on (`i` modulo
    /// [`Context::queue_count`], so with a single queue everything stays on queue 0). Chains on
    /// different queues may run at the same time; they must not write buffers another running
    /// chain reads or writes. Waits for a pending submit first.
    pub fn set_queue(&mut self, i: usize) -> Result<()> {
        self.wait()?;
        self.queue = i % self.ctx.queue_count();
        Ok(())
    }

    /// The queue index submits go to (already reduced modulo the queue count).
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// Lends `region` to the kernels recorded from now on for their temporaries (split-K
    /// partial sums and the like, used and done with inside one kernel's recording), until the
    /// next call; `None` takes it back. The caller guarantees that nothing else reads or writes
    /// the region meanwhile: an activation buffer idle in that part of the chain, so those
    /// temporaries take no memory of their own.
    pub fn lend_scratch(&mut self, region: Option<crate::buffer::BufferSlice>) {
        self.lent = region;
    }

    /// The region lent by [`Chain::lend_scratch`], if any.
    pub fn lent_scratch(&self) -> Option<&crate::buffer::BufferSlice> {
        self.lent.as_ref()
    }

    /// Number of dispatches recorded.
    pub fn dispatch_count(&self) -> usize {
        self.dispatches
    }

    /// Ends recording (implicit in the first `submit`). Appends a barrier that makes every
    /// shader and transfer write visible to the host once the chain's fence signals.
    pub fn finish(&mut self) -> Result<()> {
        if self.state != State::Recording {
            return Ok(());
        }
        if self.gate.is_some() {
            return Err(VkError::BadDispatch {
                pipeline: "chain".into(),
                detail: "finished with a gated span still open (call gate_end)".into(),
            });
        }
        if let Some(span) = &self.span {
            span.close(self.cmd);
        }
        let d = &self.ctx.inner.device;
        let to_host = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ);
        // SAFETY: the command buffer is recording and owned by this chain.
        unsafe {
            d.cmd_pipeline_barrier(
                self.cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[to_host],
                &[],
                &[],
            );
            d.end_command_buffer(self.cmd)
                .map_err(vk_err("vkEndCommandBuffer"))?;
        }
        self.state = State::Ready;
        Ok(())
    }

    /// Submits the chain (finishing the recording first if needed). If the previous submit is
    /// still running, waits for it first. Host writes made before this call (control buffers)
    /// are visible to the chain.
    pub fn submit(&mut self) -> Result<()> {
        self.submit_waiting(None)
    }

    /// [`Chain::submit`], its commands held until a host signal where one is given.
    pub(crate) fn submit_waiting(
        &mut self,
        after: Option<(crate::timeline::Timeline, u64)>,
    ) -> Result<()> {
        match self.state {
            State::Recording => self.finish()?,
            State::Pending => self.wait()?,
            State::Ready => {}
        }
        let dev = &self.ctx.inner;
        let cmds = [self.cmd];
        let sems: Vec<vk::Semaphore> = after.iter().map(|(t, _)| t.raw()).collect();
        let values: Vec<u64> = after.iter().map(|(_, v)| *v).collect();
        let stages = vec![vk::PipelineStageFlags::ALL_COMMANDS; sems.len()];
        let mut timeline =
            vk::TimelineSemaphoreSubmitInfo::default().wait_semaphore_values(&values);
        let mut info = vk::SubmitInfo::default().command_buffers(&cmds);
        if !sems.is_empty() {
            info = info
                .wait_semaphores(&sems)
                .wait_dst_stage_mask(&stages)
                .push_next(&mut timeline);
        }
        let queue = dev.queue_at(self.queue);
        // SAFETY: the command buffer is executable and idle (state Ready); the queue is locked;
        // the semaphore (if any) is kept alive by `waits_for` until the chain is waited for.
        unsafe { dev.device.queue_submit(*queue, &[info], self.fence) }
            .map_err(vk_err("vkQueueSubmit"))?;
        self.waits_for = after;
        self.state = State::Pending;
        Ok(())
    }

    /// Waits for the last submit to finish (no-op if none is pending).
    pub fn wait(&mut self) -> Result<()> {
        if !self.waitable()? {
            return Ok(());
        }
        let d = &self.ctx.inner.device;
        // SAFETY: the fence belongs to this chain and was submitted.
        unsafe {
            d.wait_for_fences(&[self.fence], true, u64::MAX)
                .map_err(vk_err("vkWaitForFences"))?;
        }
        self.reset()
    }

    /// [`Chain::wait`] with the thread asleep: the fence is checked every `interval`, never
    /// waited on in the driver, which may spin a core for the whole wait (NVIDIA's does). For
    /// long chains with another one queued behind them, where a wake-up a little late costs
    /// the device nothing.
    pub fn wait_sleeping(&mut self, interval: std::time::Duration) -> Result<()> {
        if !self.waitable()? {
            return Ok(());
        }
        let d = &self.ctx.inner.device;
        // SAFETY: the fence belongs to this chain and was submitted.
        while !unsafe { d.get_fence_status(self.fence) }.map_err(vk_err("vkGetFenceStatus"))? {
            std::thread::sleep(interval);
        }
        self.reset()
    }

    /// Whether a submit is pending (an error if it waits for a host signal not given).
    fn waitable(&self) -> Result<bool> {
        if self.state != State::Pending {
            return Ok(false);
        }
        if let Some((_, v)) = self.owed_signal()? {
            return Err(VkError::BadDispatch {
                pipeline: "chain".into(),
                detail: format!("waiting for a chain that waits for host signal {v}, not given"),
            });
        }
        Ok(true)
    }

    /// After the fence signalled: ready for the next submit.
    fn reset(&mut self) -> Result<()> {
        let d = &self.ctx.inner.device;
        // SAFETY: the fence belongs to this chain and is signalled (no submit uses it).
        unsafe { d.reset_fences(&[self.fence]) }.map_err(vk_err("vkResetFences"))?;
        self.state = State::Ready;
        Ok(())
    }

    /// `submit` then `wait`.
    pub fn run(&mut self) -> Result<()> {
        self.submit()?;
        self.wait()
    }

    /// Per-dispatch GPU times of the last completed submit, in recording order; `None` for a
    /// chain made without profiling. Sum them by label with [`crate::summarize`].
    pub fn timings(&mut self) -> Result<Option<Vec<DispatchTime>>> {
        if self.state == State::Recording {
            return Err(VkError::BadDispatch {
                pipeline: "chain".into(),
                detail: "timings read before the chain ran".into(),
            });
        }
        self.wait()?;
        self.timestamps.as_ref().map(|t| t.read()).transpose()
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        if self.state == State::Pending {
            // a chain still held for a host signal gets it, or the wait below never ends
            match self.owed_signal() {
                Ok(Some((t, v))) => {
                    if let Err(e) = t.signal(v) {
                        tracing::error!("releasing a chain held for a host signal: {e}");
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::error!("reading a timeline before dropping a chain: {e}"),
            }
            if let Err(e) = self.wait() {
                tracing::error!("waiting for a chain before dropping it: {e}");
                let _ = self.ctx.wait_idle();
            }
        }
        self.span = None;
        let d = &self.ctx.inner.device;
        // SAFETY: nothing is pending; destroying the pool frees the command buffer.
        unsafe {
            d.destroy_fence(self.fence, None);
            d.destroy_command_pool(self.pool, None);
        }
    }
}
