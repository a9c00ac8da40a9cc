//! The end of a chain of VM steps (shader `vm_drain.comp`): what the host reads after a submit
//! — the header, the event ring's unread records with their outputs' tokens, Σ generated — is
//! moved into the chain's *outbox*, a host-visible buffer, and the ring is emptied for the next
//! chain. With two chains, each with its own outbox, the host reads one chain's outputs while
//! the GPU runs the other (`octoflow_agents::GpuRun`), and never downloads the state mid-run.
//!
//! Outbox words ([`layout`]): the header as the steps left it (`H_WORDS`), then the counters
//! `O_EVENTS_N`, `O_TOKENS_N`, `O_OVERFLOW`, `O_GEN_LO`/`O_GEN_HI`, `O_BAD`, the events from
//! `O_EVENTS` (room for `H_EV_CAP`), then the tokens. An output event's `E_OFFSET` is rewritten
//! to its tokens' offset among the outbox's tokens; when they do not all fit (`O_OVERFLOW`)
//! nothing is gathered and the offsets stay the arena's (the host reads the arena instead).

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use super::layout::{self as l, EVENT_WORDS, H_EV_CAP, H_WORDS};
use super::{check_state, VmBuffers};
use crate::error::Result;
use crate::operand::need;
use crate::shaders;

/// Words of an outbox for an event ring of `ev_cap` records and `token_cap` tokens.
pub fn outbox_words(ev_cap: u32, token_cap: u32) -> u64 {
    u64::from(l::O_EVENTS) + u64::from(ev_cap) * u64::from(EVENT_WORDS) + u64::from(token_cap)
}

/// The drain dispatch, built once per device.
pub struct VmDrain {
    pipeline: Pipeline,
}

impl VmDrain {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(VmDrain {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::VM_DRAIN, 5, 4))?,
        })
    }

    /// Records the drain of `state` (`instances` instances, an event ring of `ev_cap`
    /// records) into `outbox`, which holds [`outbox_words`]`(ev_cap, token_cap)` words.
    pub fn record(
        &self,
        chain: &mut Chain,
        state: &VmBuffers,
        instances: u32,
        ev_cap: u32,
        outbox: &BufferSlice,
        token_cap: u32,
    ) -> Result<()> {
        const OP: &str = "vm_drain";
        check_state(OP, state, instances)?;
        need(
            OP,
            "events",
            &state.events,
            u128::from(ev_cap) * u128::from(EVENT_WORDS),
        )?;
        need(
            OP,
            "outbox",
            outbox,
            u128::from(outbox_words(ev_cap, token_cap)),
        )?;
        let bindings = [
            state.hdr.clone(),
            state.inst.clone(),
            state.arena.clone(),
            state.events.clone(),
            outbox.clone(),
        ];
        chain.dispatch(
            &self.pipeline,
            &bindings,
            &Push::new().u32(token_cap),
            [1, 1, 1],
        )?;
        Ok(())
    }
}

/// CPU reference of [`VmDrain::record`]: the outbox's words (its first
/// [`outbox_words`]`(hdr[H_EV_CAP], token_cap)`, unwritten ones zero) and `hdr` with its ring
/// emptied.
pub fn vm_drain_ref(
    hdr: &mut [u32],
    inst: &[u32],
    arena: &[u32],
    events: &[u32],
    token_cap: u32,
) -> Vec<u32> {
    let h = |at: u32| hdr[at as usize];
    let cap = h(H_EV_CAP);
    let read = h(l::H_EV_READ);
    let pending = h(l::H_EV_HEAD).wrapping_sub(read);
    let n_ev = if cap == 0 { 0 } else { pending.min(cap) };
    let arena_cap = h(l::H_ARENA_CAP);
    let ew = EVENT_WORDS as usize;
    let record = |e: u32| {
        let at = (read.wrapping_add(e) % cap) as usize * ew;
        &events[at..at + ew]
    };
    let is_output = |r: &[u32]| r[l::E_KIND as usize] == l::EV_OUTPUT;
    let total = (0..n_ev)
        .map(record)
        .filter(|r| is_output(r))
        .fold(0u32, |s, r| s.wrapping_add(r[l::E_LEN as usize]));
    let overflow = total > token_cap;
    let mut gen = 0u64;
    for i in 0..h(l::H_N) as usize {
        let b = i * l::INST_WORDS as usize;
        let lo = inst[b + l::I_GENERATED_LO as usize];
        let hi = inst[b + l::I_GENERATED_HI as usize];
        gen = gen.wrapping_add(u64::from(lo) | (u64::from(hi) << 32));
    }
    let mut out = vec![0u32; outbox_words(cap, token_cap) as usize];
    out[..H_WORDS as usize].copy_from_slice(&hdr[..H_WORDS as usize]);
    let tokens_at = l::O_EVENTS as usize + cap as usize * ew;
    let (mut off, mut bad) = (0u32, false);
    for e in 0..n_ev {
        let r = record(e);
        let o = l::O_EVENTS as usize + e as usize * ew;
        out[o..o + ew].copy_from_slice(r);
        if is_output(r) && !overflow {
            let (src, len) = (r[l::E_OFFSET as usize], r[l::E_LEN as usize]);
            if src > arena_cap || len > arena_cap - src {
                bad = true;
            } else {
                let dst = tokens_at + off as usize;
                out[dst..dst + len as usize]
                    .copy_from_slice(&arena[src as usize..(src + len) as usize]);
            }
            out[o + l::E_OFFSET as usize] = off;
            off += len;
        }
    }
    out[l::O_EVENTS_N as usize] = n_ev;
    out[l::O_TOKENS_N as usize] = total;
    out[l::O_OVERFLOW as usize] = u32::from(overflow);
    out[l::O_GEN_LO as usize] = gen as u32;
    out[l::O_GEN_HI as usize] = (gen >> 32) as u32;
    out[l::O_BAD as usize] = u32::from(bad);
    for at in [l::H_EV_HEAD, l::H_EV_READ, l::H_EV_LOST] {
        hdr[at as usize] = 0;
    }
    out
}

#[cfg(test)]
#[path = "vm_drain_tests.rs"]
mod tests;
