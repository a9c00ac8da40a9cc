//! Recording into a [`Chain`]: dispatches (direct and indirect), barriers, fills and copies.

use std::sync::Arc;

use ash::vk;

use crate::buffer::{Buffer, BufferSlice};
use crate::chain::{Chain, State};
use crate::error::{Result, VkError};
use crate::pipeline::Pipeline;
use crate::timestamps::Cost;
use crate::transfer::check_fill;

/// Every write stage and access a chain uses, for full barriers.
const STAGES: vk::PipelineStageFlags = vk::PipelineStageFlags::from_raw(
    vk::PipelineStageFlags::COMPUTE_SHADER.as_raw()
        | vk::PipelineStageFlags::TRANSFER.as_raw()
        | vk::PipelineStageFlags::DRAW_INDIRECT.as_raw(),
);
const WRITES: vk::AccessFlags = vk::AccessFlags::from_raw(
    vk::AccessFlags::SHADER_WRITE.as_raw() | vk::AccessFlags::TRANSFER_WRITE.as_raw(),
);
const ACCESSES: vk::AccessFlags = vk::AccessFlags::from_raw(
    vk::AccessFlags::SHADER_READ.as_raw()
        | vk::AccessFlags::SHADER_WRITE.as_raw()
        | vk::AccessFlags::TRANSFER_READ.as_raw()
        | vk::AccessFlags::TRANSFER_WRITE.as_raw()
        | vk::AccessFlags::INDIRECT_COMMAND_READ.as_raw(),
);

impl Chain {
    /// Records `pipeline` over `groups` workgroups with `bindings[i]` at binding `i` and the
    /// push-constant block `push` (exactly the pipeline's push size). Inside a gated span
    /// ([`Chain::gate_begin`]) it becomes an indirect dispatch through the span's next slot.
    pub fn dispatch(
        &mut self,
        pipeline: &Pipeline,
        bindings: &[BufferSlice],
        push: &[u8],
        groups: [u32; 3],
    ) -> Result<()> {
        let max = self.ctx.caps().max_workgroup_count;
        if groups.iter().zip(max).any(|(&g, m)| g > m) {
            return Err(self.bad(
                pipeline,
                format!("groups {groups:?} exceed the device's {max:?}"),
            ));
        }
        if let Some((args, offset)) = self.next_gate_slot(groups)? {
            let slot = args.slice(offset, 12)?;
            return self.dispatch_indirect(pipeline, bindings, push, &slot);
        }
        self.bind(pipeline, bindings, push)?;
        // SAFETY: recording; pipeline, set and push constants are bound just above.
        unsafe {
            self.ctx
                .inner
                .device
                .cmd_dispatch(self.cmd, groups[0], groups[1], groups[2])
        };
        self.after_dispatch(pipeline)
    }

    /// Records `pipeline` with its workgroup counts read on the GPU from `args` (three u32:
    /// x, y, z). A kernel that writes zeros there turns this dispatch into a no-op: the stop-flag
    /// mechanism for multi-step decode chains.
    pub fn dispatch_indirect(
        &mut self,
        pipeline: &Pipeline,
        bindings: &[BufferSlice],
        push: &[u8],
        args: &BufferSlice,
    ) -> Result<()> {
        if args.size < 12 || !args.offset.is_multiple_of(4) {
            return Err(self.bad(
                pipeline,
                format!(
                    "indirect args at {}+{} (need 12 bytes, 4-aligned)",
                    args.offset, args.size
                ),
            ));
        }
        self.keep(&args.buffer);
        self.bind(pipeline, bindings, push)?;
        // SAFETY: recording; the args buffer has INDIRECT_BUFFER usage and is kept alive.
        unsafe {
            self.ctx
                .inner
                .device
                .cmd_dispatch_indirect(self.cmd, args.buffer.raw(), args.offset)
        };
        self.after_dispatch(pipeline)
    }

    /// A full barrier: every earlier shader/transfer write is visible to every later shader,
    /// transfer and indirect-argument read.
    pub fn barrier(&mut self) -> Result<()> {
        self.memory_barrier((STAGES, WRITES), (STAGES, ACCESSES))
    }

    /// A barrier after which later commands see what the host wrote to mapped memory while
    /// the chain was already submitted, before the host signal it waits for
    /// ([`Chain::submit_after`]); also a full [`Chain::barrier`].
    pub fn host_barrier(&mut self) -> Result<()> {
        self.memory_barrier(
            (
                STAGES | vk::PipelineStageFlags::HOST,
                WRITES | vk::AccessFlags::HOST_WRITE,
            ),
            (STAGES, ACCESSES),
        )
    }

    /// A barrier between compute dispatches only: every earlier shader write is visible to
    /// later shaders. Cheaper than [`Chain::barrier`] on drivers whose command front end must
    /// otherwise wait before it may read indirect arguments or start transfers; use the full
    /// barrier where a transfer, an indirect-argument read or a host read follows.
    pub fn compute_barrier(&mut self) -> Result<()> {
        let compute = vk::PipelineStageFlags::COMPUTE_SHADER;
        self.memory_barrier(
            (compute, vk::AccessFlags::SHADER_WRITE),
            (
                compute,
                vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
            ),
        )
    }

    /// One global memory barrier from (stages, accesses) `src` to `dst`.
    fn memory_barrier(
        &mut self,
        src: (vk::PipelineStageFlags, vk::AccessFlags),
        dst: (vk::PipelineStageFlags, vk::AccessFlags),
    ) -> Result<()> {
        self.check_recording()?;
        let b = vk::MemoryBarrier::default()
            .src_access_mask(src.1)
            .dst_access_mask(dst.1);
        // SAFETY: recording into this chain's command buffer.
        unsafe {
            self.ctx.inner.device.cmd_pipeline_barrier(
                self.cmd,
                src.0,
                dst.0,
                vk::DependencyFlags::empty(),
                &[b],
                &[],
                &[],
            )
        };
        Ok(())
    }

    /// A barrier limited to `slices`: earlier writes to them are visible to later reads.
    pub fn buffer_barrier(&mut self, slices: &[BufferSlice]) -> Result<()> {
        self.check_recording()?;
        let barriers: Vec<_> = slices
            .iter()
            .map(|s| {
                vk::BufferMemoryBarrier::default()
                    .src_access_mask(WRITES)
                    .dst_access_mask(ACCESSES)
                    .src_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                    .dst_queue_family_index(vk::QUEUE_FAMILY_IGNORED)
                    .buffer(s.buffer.raw())
                    .offset(s.offset)
                    .size(s.size)
            })
            .collect();
        for s in slices {
            self.keep(&s.buffer);
        }
        // SAFETY: recording; the buffers are kept alive by the chain.
        unsafe {
            self.ctx.inner.device.cmd_pipeline_barrier(
                self.cmd,
                STAGES,
                STAGES,
                vk::DependencyFlags::empty(),
                &[],
                &barriers,
                &[],
            )
        };
        Ok(())
    }

    /// Fills `dst` with the 32-bit pattern `value` (offset and size multiples of 4).
    pub fn fill(&mut self, dst: &BufferSlice, value: u32) -> Result<()> {
        self.check_recording()?;
        check_fill(&dst.buffer, dst.offset, dst.size)?;
        self.keep(&dst.buffer);
        // SAFETY: recording; range checked; buffer kept alive.
        unsafe {
            self.ctx.inner.device.cmd_fill_buffer(
                self.cmd,
                dst.buffer.raw(),
                dst.offset,
                dst.size,
                value,
            )
        };
        Ok(())
    }

    /// Copies `src` to `dst` at byte `dst_offset`.
    pub fn copy(&mut self, src: &BufferSlice, dst: &Buffer, dst_offset: u64) -> Result<()> {
        self.check_recording()?;
        src.buffer.check_range(src.offset, src.size)?;
        dst.check_range(dst_offset, src.size)?;
        self.keep(&src.buffer);
        self.keep(dst);
        let region = vk::BufferCopy {
            src_offset: src.offset,
            dst_offset,
            size: src.size,
        };
        // SAFETY: recording; ranges checked; buffers kept alive.
        unsafe {
            self.ctx
                .inner
                .device
                .cmd_copy_buffer(self.cmd, src.buffer.raw(), dst.raw(), &[region])
        };
        Ok(())
    }

    /// Prefixes the profiling labels of the following dispatches (`layer3` → `layer3/add`);
    /// `None` clears it.
    pub fn set_scope(&mut self, scope: Option<&str>) {
        self.scope = scope.map(str::to_string);
    }

    fn bind(&mut self, pipeline: &Pipeline, bindings: &[BufferSlice], push: &[u8]) -> Result<()> {
        self.check_recording()?;
        self.check_bindings(pipeline, bindings, push)?;
        let p = &pipeline.inner;
        let set = self.descriptors.set_for(p.set_layout, bindings)?;
        for b in bindings {
            self.keep(&b.buffer);
        }
        if !self.kept.contains(&pipeline_key(pipeline)) {
            self.kept.insert(pipeline_key(pipeline));
            self.keep_pipelines.push(pipeline.clone());
        }
        if let Some(t) = self.timestamps.as_mut().filter(|t| !t.started()) {
            t.write(self.cmd, None)?;
        }
        let d = &self.ctx.inner.device;
        // SAFETY: recording; pipeline, layout and set are live and kept by the chain.
        unsafe {
            if self.bound != Some(p.raw) {
                d.cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, p.raw);
                self.bound = Some(p.raw);
            }
            d.cmd_bind_descriptor_sets(
                self.cmd,
                vk::PipelineBindPoint::COMPUTE,
                p.layout,
                0,
                &[set],
                &[],
            );
            if !push.is_empty() {
                d.cmd_push_constants(self.cmd, p.layout, vk::ShaderStageFlags::COMPUTE, 0, push);
            }
        }
        Ok(())
    }

    /// Declares what the last recorded dispatch moves through memory and computes, for the
    /// floors of a profiled chain's timings ([`crate::summarize`]); nothing without profiling.
    pub fn set_cost(&mut self, bytes: u64, flops: u64) {
        if let Some(t) = self.timestamps.as_mut() {
            t.set_last_cost(Cost { bytes, flops });
        }
    }

    fn after_dispatch(&mut self, pipeline: &Pipeline) -> Result<()> {
        self.dispatches += 1;
        let label = match &self.scope {
            Some(scope) => format!("{scope}/{}", pipeline.label()),
            None => pipeline.label().to_string(),
        };
        match self.timestamps.as_mut() {
            Some(t) => t.write(self.cmd, Some(label)),
            None => Ok(()),
        }
    }

    fn check_bindings(
        &self,
        pipeline: &Pipeline,
        bindings: &[BufferSlice],
        push: &[u8],
    ) -> Result<()> {
        let p = &pipeline.inner;
        if bindings.len() != p.bindings as usize {
            return Err(self.bad(
                pipeline,
                format!(
                    "{} bindings given, the pipeline has {}",
                    bindings.len(),
                    p.bindings
                ),
            ));
        }
        if push.len() != p.push_bytes as usize {
            return Err(self.bad(
                pipeline,
                format!(
                    "{} push-constant bytes given, the pipeline takes {}",
                    push.len(),
                    p.push_bytes
                ),
            ));
        }
        let caps = self.ctx.caps();
        for (i, b) in bindings.iter().enumerate() {
            b.buffer.check_range(b.offset, b.size)?;
            if !Arc::ptr_eq(&b.buffer.inner.dev, &self.ctx.inner) {
                return Err(self.bad(
                    pipeline,
                    format!(
                        "binding {i} ({}) belongs to another device",
                        b.buffer.name()
                    ),
                ));
            }
            if b.offset % caps.storage_offset_alignment != 0 {
                return Err(self.bad(
                    pipeline,
                    format!(
                        "binding {i} ({}) offset {} is not a multiple of {}",
                        b.buffer.name(),
                        b.offset,
                        caps.storage_offset_alignment
                    ),
                ));
            }
            if b.size == 0 || b.size > caps.max_storage_buffer_range {
                return Err(self.bad(
                    pipeline,
                    format!(
                        "binding {i} ({}) size {} not in 1..={}",
                        b.buffer.name(),
                        b.size,
                        caps.max_storage_buffer_range
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_recording(&self) -> Result<()> {
        if self.state == State::Recording {
            Ok(())
        } else {
            Err(VkError::BadDispatch {
                pipeline: "chain".into(),
                detail: "the chain is finished; record a new one".into(),
            })
        }
    }

    fn keep(&mut self, buffer: &Buffer) {
        let key = Arc::as_ptr(&buffer.inner) as u64;
        if self.kept.insert(key) {
            self.keep_buffers.push(buffer.clone());
        }
    }

    fn bad(&self, pipeline: &Pipeline, detail: String) -> VkError {
        VkError::BadDispatch {
            pipeline: pipeline.label().into(),
            detail,
        }
    }
}

fn pipeline_key(p: &Pipeline) -> u64 {
    Arc::as_ptr(&p.inner) as u64
}
