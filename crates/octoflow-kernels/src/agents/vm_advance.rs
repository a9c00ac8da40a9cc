//! Phase 3 of a VM step (shader `vm_advance.comp`; the reference is
//! `octoflow_agents::plan::advance`): each instance takes its rows' sampled tokens and their
//! log-probabilities, the scores `best` compares.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use super::{check_state, step_words, vm_local, VmBuffers};
use crate::error::Result;
use crate::operand::need;
use crate::shaders;

/// The advance phase, built once per device.
pub struct VmAdvance {
    pipeline: Pipeline,
    local: u32,
}

impl VmAdvance {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        let local = vm_local(ctx.caps());
        let spec = [local];
        let desc = PipelineDesc::new(shaders::VM_ADVANCE, 6, 4).spec(&spec);
        Ok(VmAdvance {
            pipeline: Pipeline::new(ctx, &desc)?,
            local,
        })
    }

    /// Records the phase over `instances` instances of `state` (reads `hdr`, `tables`; writes
    /// `inst`, `arena`) with the step record `step` of `vm_plan` and `tokens` (`[2, max_out]`
    /// u32: the token sampled for each output row, then the f32 bits of its log-probability —
    /// what `Sample::record_rows` writes with `logprobs_at = max_out`).
    pub fn record(
        &self,
        chain: &mut Chain,
        state: &VmBuffers,
        instances: u32,
        step: &BufferSlice,
        tokens: &BufferSlice,
        max_out: u32,
    ) -> Result<()> {
        const OP: &str = "vm_advance";
        check_state(OP, state, instances)?;
        need(OP, "step", step, u128::from(step_words(instances)))?;
        need(OP, "tokens", tokens, 2 * u128::from(max_out))?;
        let bindings = [
            state.hdr.clone(),
            state.inst.clone(),
            state.arena.clone(),
            state.tables.clone(),
            step.clone(),
            tokens.clone(),
        ];
        let groups = chain
            .context()
            .groups_1d(u64::from(instances.max(1)), self.local)?;
        chain.dispatch(
            &self.pipeline,
            &bindings,
            Push::new().u32(max_out).as_bytes(),
            groups,
        )?;
        Ok(())
    }
}
