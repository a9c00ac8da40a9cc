//! The agent VM's step on the GPU: the three phases of `octoflow_agents`' host interpreter
//! (docs/VM.md, "On the GPU") as compute shaders over the state [`layout`] defines.
//!
//! - [`vm_interpret`]: one invocation per instance runs its program until it yields.
//! - [`vm_plan`]: one workgroup gives out the step's rows and writes the batched forward's
//!   row tables.
//! - [`vm_advance`]: one invocation per instance takes its rows' sampled tokens.
//! - [`vm_select`]: one invocation picks the row bucket whose recorded forward the step runs
//!   (skip flags for the gated spans).
//! - [`vm_drain`]: at the end of a chain, one workgroup moves the header, the unread events
//!   and their outputs' tokens into the chain's host-visible outbox and empties the ring.
//! - [`vm_end_step`]: one workgroup counts the live instances, flags a stall and moves to the
//!   next step, so one chain holds many steps.
//!
//! The host interpreter is the reference: `octoflow-agents`' tests pack a host run into these
//! words, run each phase here and require the host's state after the same phase. Shaders:
//! `shaders/agents/`.

use octoflow_vk::{BufferSlice, DeviceCaps, DeviceKind};

use crate::error::Result;
use crate::operand::need;

pub mod layout;
pub mod vm_advance;
pub mod vm_drain;
pub mod vm_end_step;
pub mod vm_interpret;
pub mod vm_plan;
pub mod vm_select;

pub use vm_advance::VmAdvance;
pub use vm_drain::VmDrain;
pub use vm_end_step::VmEndStep;
pub use vm_interpret::VmInterpret;
pub use vm_plan::VmPlan;
pub use vm_select::VmSelect;

/// The buffers of a VM state (each an array of u32 words; see [`layout`]).
#[derive(Clone)]
pub struct VmBuffers {
    /// `[H_WORDS]`: the run's constants and counters.
    pub hdr: BufferSlice,
    /// `[instructions, INSTR_WORDS]`: the program.
    pub prog: BufferSlice,
    /// `[instances, INST_WORDS]`.
    pub inst: BufferSlice,
    /// `[H_ARENA_CAP]` tokens.
    pub arena: BufferSlice,
    /// Constants, stop sets and their sequences, end-of-generation ids.
    pub tables: BufferSlice,
    /// Queue headers, then their tasks.
    pub queues: BufferSlice,
    /// Mailbox headers, then their slots.
    pub boxes: BufferSlice,
    /// `[H_EV_CAP, EVENT_WORDS]`: the event ring.
    pub events: BufferSlice,
}

/// The sizes a dispatch needs on the host (the same numbers are in the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmDims {
    pub instances: u32,
    pub queues: u32,
    pub boxes: u32,
}

/// The tables `vm_plan` writes: the batched forward's inputs (octoflow-model's `IoSet`) and
/// what `vm_advance` reads.
#[derive(Clone)]
pub struct VmRows {
    /// `[max_rows, 2]`: (position, block table offset) per row, then the block tables.
    pub table: BufferSlice,
    /// `[max_rows]`: token ids.
    pub ids: BufferSlice,
    /// `[max_out]`: the row index of each output.
    pub out_rows: BufferSlice,
    /// `[max_rows]`: adapter mixes ([`layout::MIX_BASE`]).
    pub mix: BufferSlice,
    /// `[max_out, SAMPLER_WORDS]`: sampler states ([`crate::SamplerState`]).
    pub states: BufferSlice,
    /// `[P_INST + instances * PI_WORDS]`: the step record.
    pub step: BufferSlice,
    /// `[max_rows]`: each row's owner.
    pub owners: BufferSlice,
}

/// Invocations per workgroup of `vm_interpret` and `vm_advance` on a CPU driver: one SIMD
/// batch of lavapipe (8 lanes of AVX2). With several batches per workgroup, lavapipe (Mesa
/// 22.3) lost the stores of an instance whose interpret loop ran longer than its batch
/// neighbours' in other batches of the group (found by the phase tests; one batch is exact).
pub const CPU_LOCAL: u32 = 8;

/// The workgroup size of the per-instance phases on this device (specialization constant 0).
pub fn vm_local(caps: &DeviceCaps) -> u32 {
    if caps.kind == DeviceKind::Cpu {
        CPU_LOCAL
    } else {
        layout::VM_LOCAL
    }
}

/// Words of the step record for `instances` instances.
pub fn step_words(instances: u32) -> u64 {
    u64::from(layout::P_INST) + u64::from(instances) * u64::from(layout::PI_WORDS)
}

fn check_state(op: &'static str, s: &VmBuffers, instances: u32) -> Result<()> {
    need(op, "hdr", &s.hdr, u128::from(layout::H_WORDS))?;
    need(
        op,
        "inst",
        &s.inst,
        u128::from(instances) * u128::from(layout::INST_WORDS),
    )
}
