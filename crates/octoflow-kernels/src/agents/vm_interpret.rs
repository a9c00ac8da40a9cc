//! Phase 1 of a VM step (shader `vm_interpret.comp`; the reference is
//! `octoflow_agents::interp`): every instance in state `run` or `wait` executes until it
//! yields, lock-free against the others.

use octoflow_vk::{Chain, Context, Pipeline, PipelineDesc, Push};

use super::{check_state, vm_local, VmBuffers, VmDims};
use crate::error::Result;
use crate::shaders;

/// The interpret phase, built once per device.
pub struct VmInterpret {
    pipeline: Pipeline,
    local: u32,
}

impl VmInterpret {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        let local = vm_local(ctx.caps());
        let spec = [local];
        let desc = PipelineDesc::new(shaders::VM_INTERPRET, 8, 4).spec(&spec);
        Ok(VmInterpret {
            pipeline: Pipeline::new(ctx, &desc)?,
            local,
        })
    }

    /// Records the phase: the snapshot pass over queues and mailboxes, a barrier, the
    /// interpret pass over `dims.instances`. Reads and writes every buffer of `state`
    /// (`H_CHANGED` is cleared, then set if anything changed); the caller orders it after
    /// what wrote the state and before what reads it.
    pub fn record(&self, chain: &mut Chain, state: &VmBuffers, dims: VmDims) -> Result<()> {
        check_state("vm_interpret", state, dims.instances)?;
        let s = state;
        let bindings = [
            s.hdr.clone(),
            s.prog.clone(),
            s.inst.clone(),
            s.arena.clone(),
            s.tables.clone(),
            s.queues.clone(),
            s.boxes.clone(),
            s.events.clone(),
        ];
        let ctx = chain.context().clone();
        // At least one invocation: it clears H_CHANGED.
        let tables = u64::from(dims.queues.max(dims.boxes).max(1));
        let groups = ctx.groups_1d(tables, self.local)?;
        chain.dispatch(
            &self.pipeline,
            &bindings,
            Push::new().u32(0).as_bytes(),
            groups,
        )?;
        chain.compute_barrier()?;
        let groups = ctx.groups_1d(u64::from(dims.instances.max(1)), self.local)?;
        chain.dispatch(
            &self.pipeline,
            &bindings,
            Push::new().u32(1).as_bytes(),
            groups,
        )?;
        Ok(())
    }
}
