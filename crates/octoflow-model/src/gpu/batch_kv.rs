//! [`GpuBatch`]'s KV blocks: placing a step's slots in the pool (forgetting what a step
//! overwrites, copying a shared block's kept rows, growing to the rows it reaches) and the
//! per-slot layout the agent VM's GPU plan addresses.

use std::collections::HashMap;

use octoflow_vk::Chain;

use super::GpuBatch;
use crate::batch::BatchRow;
use crate::error::Result;
use crate::kv_pool::{blocks_for, KvPool, PAGE};

impl GpuBatch<'_> {
    /// Gives the step's slots their blocks: each slot forgets what its first row overwrites
    /// (copying a kept part of a block it shares, see [`KvPool::truncate`]) and grows to its
    /// last row. A slot that forgot positions keeps having forgotten them if the pool then
    /// has no room (the step fails with [`ModelError::KvFull`]).
    pub(super) fn place(&mut self, spans: &[(u32, u32, u32)]) -> Result<()> {
        for &(slot, first, _) in spans {
            let s = slot as usize;
            let copy = self.pool.truncate(s, first as usize);
            let held = (self.pool.table(s).len() * PAGE) as u32;
            self.cached[s] = self.cached[s].min(first).min(held);
            if let Some((from, to, rows)) = copy? {
                self.copy_rows(from, to, rows as u32)?;
            }
        }
        let wants: Vec<(usize, usize)> = spans
            .iter()
            .map(|&(slot, _, last)| (slot as usize, last as usize + 1))
            .collect();
        self.pool.grow(&wants)?;
        Ok(())
    }

    /// Copies the first `rows` rows of block `from` to block `to` in every layer's caches, after
    /// every step submitted so far (a one-off chain on the steps' queue, waited for: rare, a
    /// rewind into a shared block).
    fn copy_rows(&mut self, from: u32, to: u32, rows: u32) -> Result<()> {
        let c = &self.model.config;
        let kv = self.s.kv_type;
        let row_bytes = [
            kv.bytes_for((c.n_head_kv * c.head_dim) as u64),
            kv.bytes_for((c.n_head_kv * c.head_dim_v) as u64),
        ];
        let page = PAGE as u64;
        let mut chain = Chain::new(&self.model.ctx)?;
        chain.barrier()?;
        for (kc, vc) in &self.s.kv {
            for (buf, rb) in [(kc, row_bytes[0]), (vc, row_bytes[1])] {
                let src = buf.slice(u64::from(from) * page * rb, u64::from(rows) * rb)?;
                chain.copy(&src, buf, u64::from(to) * page * rb)?;
            }
        }
        chain.run()?;
        Ok(())
    }

    /// The KV pool's bookkeeping (blocks, the prefix cache's counters).
    pub fn kv_pool(&self) -> &KvPool {
        &self.pool
    }

    /// Gives every slot its whole context's blocks in slot order (slot `s`: blocks
    /// `s * slot_blocks ..`) for a caller that addresses the caches by slot, the agent VM's GPU
    /// plan; returns `slot_blocks` and the block tables to place after the row pairs of its
    /// table buffer: each slot's, then the padding rows' (the spare block). The pool must be
    /// untouched and hold every slot's context.
    pub fn contiguous_tables(&mut self) -> Result<(u32, Vec<u32>)> {
        let slot_blocks = blocks_for(self.n_ctx as usize);
        self.pool.take_contiguous(slot_blocks)?;
        let mut words = Vec::with_capacity(self.n_slots as usize * slot_blocks + 1);
        for s in 0..self.n_slots as usize {
            words.extend(self.pool.table(s));
        }
        words.push(self.pool.n_blocks() as u32);
        Ok((slot_blocks as u32, words))
    }
}

/// Each slot of a step with its first and last row's positions, in order of first appearance.
pub(super) fn slot_spans(rows: &[BatchRow]) -> Vec<(u32, u32, u32)> {
    let mut spans: Vec<(u32, u32, u32)> = Vec::new();
    let mut at: HashMap<u32, usize> = HashMap::new();
    for r in rows {
        match at.get(&r.slot) {
            Some(&i) => spans[i].2 = r.pos,
            None => {
                at.insert(r.slot, spans.len());
                spans.push((r.slot, r.pos, r.pos));
            }
        }
    }
    spans
}
