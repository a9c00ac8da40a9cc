//! Gated recording: a span of a chain whose dispatches can all be turned into no-ops on the GPU.
//!
//! Between [`Chain::gate_begin`] and [`Chain::gate_end`], every [`Chain::dispatch`] is recorded
//! as an indirect dispatch whose workgroup counts are read from consecutive 12-byte slots of an
//! `args` buffer. `gate_end` returns the counts that were asked for, slot by slot (the *template*).
//! A small kernel recorded before the span (the caller's) copies either the template or zeros
//! into `args`, depending on a flag the GPU itself wrote, so a recorded multi-step decode chain
//! stops doing work after an end-of-generation token without the CPU in the loop.

use crate::buffer::Buffer;
use crate::chain::Chain;
use crate::error::{Result, VkError};

/// An open gated span.
pub(crate) struct Gate {
    pub args: Buffer,
    pub groups: Vec<[u32; 3]>,
}

impl Chain {
    /// Starts a gated span: following dispatches read their workgroup counts from slot `i`
    /// (bytes `12 i .. 12 i + 12`) of `args`, in recording order.
    pub fn gate_begin(&mut self, args: &Buffer) -> Result<()> {
        if self.gate.is_some() {
            return Err(VkError::BadDispatch {
                pipeline: "chain".into(),
                detail: "gate_begin inside an open gated span".into(),
            });
        }
        self.gate = Some(Gate {
            args: args.clone(),
            groups: Vec::new(),
        });
        Ok(())
    }

    /// Ends the gated span and returns the workgroup counts of its dispatches, one per slot.
    pub fn gate_end(&mut self) -> Result<Vec<[u32; 3]>> {
        self.gate
            .take()
            .map(|g| g.groups)
            .ok_or_else(|| VkError::BadDispatch {
                pipeline: "chain".into(),
                detail: "gate_end without gate_begin".into(),
            })
    }

    /// Inside a gated span: the args slot for the next dispatch of `groups` (registered in the
    /// template). `None` outside a span.
    pub(crate) fn next_gate_slot(&mut self, groups: [u32; 3]) -> Result<Option<(Buffer, u64)>> {
        let Some(gate) = self.gate.as_mut() else {
            return Ok(None);
        };
        let offset = 12 * gate.groups.len() as u64;
        if offset + 12 > gate.args.size() {
            return Err(VkError::BadRange {
                what: gate.args.name().into(),
                detail: format!(
                    "gated dispatch #{} needs bytes {offset}..{} but the args buffer has {}",
                    gate.groups.len(),
                    offset + 12,
                    gate.args.size()
                ),
            });
        }
        gate.groups.push(groups);
        Ok(Some((gate.args.clone(), offset)))
    }
}

/// The template as the u32 words a gate kernel copies into the args buffer.
pub fn gate_words(groups: &[[u32; 3]]) -> Vec<u32> {
    groups.iter().flatten().copied().collect()
}
