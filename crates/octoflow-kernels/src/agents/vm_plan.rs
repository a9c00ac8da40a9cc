//! Phase 2 of a VM step (shader `vm_plan.comp`; the reference is `octoflow_agents::plan::plan`):
//! the step's rows, written as the batched forward's row tables and a step record.

use octoflow_vk::{Chain, Context, Pipeline, PipelineDesc, Push};

use super::layout::SAMPLER_WORDS;
use super::{check_state, step_words, VmBuffers, VmRows};
use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

/// The forward's shape the rows are given for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowShape {
    /// Rows of one step (`BatchForward::max_rows`); every row table holds this many.
    pub max_rows: u32,
    /// Output rows the output tables hold. A step may ask for more (the step record says how
    /// many); the caller must not run such a step.
    pub max_out: u32,
    /// The engine's KV slots: padding rows use the spare one after them.
    pub n_slots: u32,
    /// KV blocks per slot: a row's block table offset is `2 max_rows + slot * slot_blocks`
    /// (the padding rows' `2 max_rows + n_slots * slot_blocks`); the caller writes those
    /// tables after the row pairs ([`crate::page`]).
    pub slot_blocks: u32,
}

/// The plan phase, built once per device.
pub struct VmPlan {
    pipeline: Pipeline,
}

impl VmPlan {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(VmPlan {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::VM_PLAN, 10, 16))?,
        })
    }

    /// Records the phase over `instances` instances of `state` (reads `hdr`, `inst`, `arena`)
    /// into `rows`: every word of every table up to `shape`'s sizes is written (padding
    /// included), and the step record's `P_*` words and each instance's `PI_*` words.
    pub fn record(
        &self,
        chain: &mut Chain,
        state: &VmBuffers,
        instances: u32,
        rows: &VmRows,
        shape: RowShape,
    ) -> Result<()> {
        const OP: &str = "vm_plan";
        check_state(OP, state, instances)?;
        if shape.max_rows == 0 {
            return Err(bad(OP, "no rows".into()));
        }
        let (r, o) = (u128::from(shape.max_rows), u128::from(shape.max_out));
        need(OP, "table", &rows.table, 2 * r)?;
        need(OP, "ids", &rows.ids, r)?;
        need(OP, "out_rows", &rows.out_rows, o)?;
        need(OP, "mix", &rows.mix, r)?;
        need(OP, "states", &rows.states, o * u128::from(SAMPLER_WORDS))?;
        need(OP, "step", &rows.step, u128::from(step_words(instances)))?;
        need(OP, "owners", &rows.owners, r)?;
        let bindings = [
            state.hdr.clone(),
            state.inst.clone(),
            state.arena.clone(),
            rows.table.clone(),
            rows.ids.clone(),
            rows.out_rows.clone(),
            rows.mix.clone(),
            rows.states.clone(),
            rows.step.clone(),
            rows.owners.clone(),
        ];
        let push = Push::new()
            .u32(shape.max_rows)
            .u32(shape.max_out)
            .u32(shape.n_slots)
            .u32(shape.slot_blocks);
        chain.dispatch(&self.pipeline, &bindings, push.as_bytes(), [1, 1, 1])?;
        Ok(())
    }
}
