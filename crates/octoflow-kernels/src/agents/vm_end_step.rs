//! The end of a VM step (shader `vm_end_step.comp`; the reference is
//! `octoflow_agents::Run::end_step`): live count, stall flag, next step number — what lets one
//! chain hold many steps.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc};

use super::{check_state, step_words, VmBuffers};
use crate::error::Result;
use crate::operand::need;
use crate::shaders;

/// The end-of-step dispatch, built once per device.
pub struct VmEndStep {
    pipeline: Pipeline,
}

impl VmEndStep {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(VmEndStep {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::VM_END_STEP, 3, 0))?,
        })
    }

    /// Records it over `instances` instances of `state` with the step record `step` of the
    /// step's `vm_plan` (writes `H_STALLED`, `H_LIVE`, `H_STEP_*`).
    pub fn record(
        &self,
        chain: &mut Chain,
        state: &VmBuffers,
        instances: u32,
        step: &BufferSlice,
    ) -> Result<()> {
        const OP: &str = "vm_end_step";
        check_state(OP, state, instances)?;
        need(OP, "step", step, u128::from(step_words(instances)))?;
        let bindings = [state.hdr.clone(), state.inst.clone(), step.clone()];
        chain.dispatch(&self.pipeline, &bindings, &[], [1, 1, 1])?;
        Ok(())
    }
}
