//! The KV block pool: which cache blocks each sequence uses, and the prefix cache over them.
//!
//! The batch engine's caches are one pool of blocks of [`PAGE`] positions
//! (`octoflow_kernels::page`). A sequence (a slot) owns a block table that grows as its rows
//! reach new blocks, so memory follows the positions in use rather than `slots × n_ctx`.
//!
//! Prefix caching (as vLLM's automatic prefix caching): a full block can be *registered* under
//! the tokens it holds and a hash of everything before it (the chain of its predecessors' keys,
//! and the LoRA adapter the positions ran with, whose keys and values differ from the base's).
//! A new sequence whose prompt starts with registered blocks *adopts* them — its table points at
//! the same blocks — and prefills only the rest. Blocks are reference-counted; a registered block
//! nobody uses stays cached until a new block is needed and it is the least recently released.
//! Only whole blocks are shared and shared blocks are never written: a sequence that rewinds into
//! a block others use gets a copy of its kept rows first ([`KvPool::truncate`] says which).
//!
//! Reservations keep admission honest: a sequence may reserve the blocks it will need, and
//! nobody else's growth or adoption can take them.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

pub use octoflow_kernels::blocks_for;
use octoflow_kernels::KV_PAGE;

/// Positions per block.
pub const PAGE: usize = KV_PAGE as usize;

/// A sequence could not get the blocks it needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the KV cache is full: {need} more blocks of {PAGE} positions are needed and {available} are \
     available (of {total})"
)]
pub struct KvFull {
    pub need: usize,
    pub available: usize,
    pub total: usize,
}

/// What a registered block holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// Hash of the block before it in the sequence (0 for the first).
    parent: u64,
    adapter: Option<u32>,
    tokens: [u32; PAGE],
}

impl Key {
    /// The key of block `i` of `tokens` (which must reach its end) after `parent`.
    fn of_block(parent: u64, adapter: Option<u32>, tokens: &[u32], i: usize) -> Self {
        let mut block = [0; PAGE];
        block.copy_from_slice(&tokens[i * PAGE..(i + 1) * PAGE]);
        Key {
            parent,
            adapter,
            tokens: block,
        }
    }

    fn hash64(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        // 0 is the first block's parent: keep it out of the hashes blocks get
        h.finish().max(1)
    }
}

#[derive(Debug, Clone, Default)]
struct Block {
    /// Sequences whose tables name it.
    refs: u32,
    /// Its key and hash while registered.
    key: Option<(u64, Key)>,
    /// The tick it entered the evictable set (registered, no references).
    parked: u64,
}

/// Counters of the prefix cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Registered blocks evicted to make room.
    pub evicted: u64,
    /// Copies made because a sequence rewound into a block others share.
    pub copies: u64,
}

/// The pool's bookkeeping (no device memory: the engine maps block ids to its cache rows).
#[derive(Debug, Clone)]
pub struct KvPool {
    blocks: Vec<Block>,
    /// Free blocks holding nothing registered (popped from the end: low ids first).
    free: Vec<u32>,
    /// Registered blocks nobody uses, by the tick they were parked (oldest first).
    evictable: BTreeMap<u64, u32>,
    /// Hash → registered block.
    index: HashMap<u64, u32>,
    /// Per slot: its block table.
    tables: Vec<Vec<u32>>,
    /// Per slot: blocks promised to it beyond its table.
    reserved: Vec<usize>,
    reserved_total: usize,
    clock: u64,
    caching: bool,
    stats: PoolStats,
}

impl KvPool {
    /// `n_blocks` blocks for `n_slots` sequences; `caching` false never registers anything.
    pub fn new(n_blocks: usize, n_slots: usize, caching: bool) -> Self {
        Self {
            blocks: vec![Block::default(); n_blocks],
            free: (0..n_blocks as u32).rev().collect(),
            evictable: BTreeMap::new(),
            index: HashMap::new(),
            tables: vec![Vec::new(); n_slots],
            reserved: vec![0; n_slots],
            reserved_total: 0,
            clock: 0,
            caching,
            stats: PoolStats::default(),
        }
    }

    /// Blocks in the pool.
    pub fn n_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks nobody uses (free, or cached and evictable).
    pub fn unused(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks a slot without a reservation may still take.
    pub fn available(&self) -> usize {
        self.unused().saturating_sub(self.reserved_total)
    }

    /// Registered blocks (in use or not).
    pub fn cached(&self) -> usize {
        self.index.len()
    }

    pub fn stats(&self) -> PoolStats {
        self.stats
    }

    /// Whether registering is on.
    pub fn caching(&self) -> bool {
        self.caching
    }

    /// `slot`'s block table.
    pub fn table(&self, slot: usize) -> &[u32] {
        self.tables.get(slot).map_or(&[], Vec::as_slice)
    }

    /// Promises `slot` the blocks it needs to hold `positions` positions (its table included),
    /// replacing its earlier promise.
    pub fn reserve(&mut self, slot: usize, positions: usize) -> Result<(), KvFull> {
        let have = self.table(slot).len();
        let want = blocks_for(positions).saturating_sub(have);
        let old = self.reserved.get(slot).copied().unwrap_or(0);
        let others = self.reserved_total - old;
        let can = self.unused().saturating_sub(others);
        if want > can {
            return Err(self.full(want, can));
        }
        if let Some(r) = self.reserved.get_mut(slot) {
            *r = want;
            self.reserved_total = others + want;
        }
        Ok(())
    }

    /// Grows each `(slot, positions)` table to hold its positions; nothing changes when the
    /// blocks are not all there (reserved blocks first, then what no one has reserved).
    pub fn grow(&mut self, wants: &[(usize, usize)]) -> Result<(), KvFull> {
        let mut from_pool = 0;
        for &(slot, positions) in wants {
            let need = blocks_for(positions).saturating_sub(self.table(slot).len());
            from_pool += need - self.reserved.get(slot).copied().unwrap_or(0).min(need);
        }
        if from_pool > self.available() {
            return Err(self.full(from_pool, self.available()));
        }
        for &(slot, positions) in wants {
            while self.table(slot).len() < blocks_for(positions) {
                if self.reserved[slot] > 0 {
                    self.reserved[slot] -= 1;
                    self.reserved_total -= 1;
                }
                let b = self.take().ok_or_else(|| self.full(1, 0))?;
                self.tables[slot].push(b);
            }
        }
        Ok(())
    }

    /// Forgets `slot`'s positions from `len` on: blocks past it go back to the pool. When the
    /// block holding position `len` is kept (`len` inside it) and other sequences use it, the
    /// slot gets a fresh block instead: returns `(from, to, rows)` — the engine must copy
    /// the first `rows` rows of block `from` into block `to` before the slot writes again.
    /// When no block is left for that copy, the slot keeps only the whole blocks before
    /// `len` (its table says how many) and the error says so.
    pub fn truncate(
        &mut self,
        slot: usize,
        len: usize,
    ) -> Result<Option<(u32, u32, usize)>, KvFull> {
        let keep = blocks_for(len);
        while self.table(slot).len() > keep {
            if let Some(b) = self.tables[slot].pop() {
                self.unref(b);
            }
        }
        let rows = len % PAGE;
        let Some(&last) = self.table(slot).last().filter(|_| rows != 0) else {
            return Ok(None);
        };
        let shared = self.blocks[last as usize].refs > 1;
        if !shared {
            // only this slot holds it: it will be written, so it no longer holds its key
            self.unregister(last);
            return Ok(None);
        }
        if self.available() == 0 && self.reserved[slot] == 0 {
            // no block for the copy: the slot keeps only the whole blocks before it
            if let Some(b) = self.tables[slot].pop() {
                self.unref(b);
            }
            return Err(self.full(1, 0));
        }
        if self.reserved[slot] > 0 {
            self.reserved[slot] -= 1;
            self.reserved_total -= 1;
        }
        let to = self.take().ok_or_else(|| self.full(1, 0))?;
        self.unref(last);
        if let Some(t) = self.tables[slot].last_mut() {
            *t = to;
        }
        self.stats.copies += 1;
        Ok(Some((last, to, rows)))
    }

    /// Registers `slot`'s full blocks within `tokens` (the tokens at its positions
    /// `0..tokens.len()`, run with `adapter`) for others to adopt. Blocks already registered
    /// stay as they are; a block whose content another block already holds is not registered
    /// twice.
    pub fn register(&mut self, slot: usize, tokens: &[u32], adapter: Option<u32>) {
        if !self.caching {
            return;
        }
        let n = (tokens.len() / PAGE).min(self.table(slot).len());
        let mut parent = 0u64;
        for i in 0..n {
            let b = self.tables[slot][i];
            let key = Key::of_block(parent, adapter, tokens, i);
            let h = key.hash64();
            match &self.blocks[b as usize].key {
                Some((bh, k)) if *k == key => parent = *bh,
                Some(_) => return, // holds other tokens than the caller says: stop here
                None => {
                    if let std::collections::hash_map::Entry::Vacant(e) = self.index.entry(h) {
                        e.insert(b);
                        self.blocks[b as usize].key = Some((h, key));
                    }
                    parent = h;
                }
            }
        }
    }

    /// Positions of `prompt` (run with `adapter`) an empty slot would adopt: whole registered
    /// blocks, short of the last prompt token (which must run to give the first token's
    /// logits).
    pub fn lookup(&self, prompt: &[u32], adapter: Option<u32>) -> usize {
        self.chain(prompt, adapter).len() * PAGE
    }

    /// The registered blocks `prompt` starts with.
    fn chain(&self, prompt: &[u32], adapter: Option<u32>) -> Vec<u32> {
        let mut out = Vec::new();
        if !self.caching || prompt.is_empty() {
            return out;
        }
        let n = (prompt.len() - 1) / PAGE;
        let mut parent = 0u64;
        // adopting parked blocks takes them from what others may use
        let mut parked_budget = self.available();
        for i in 0..n {
            let key = Key::of_block(parent, adapter, prompt, i);
            let h = key.hash64();
            let Some(&b) = self.index.get(&h) else { break };
            let blk = &self.blocks[b as usize];
            if blk.key.as_ref().map(|(_, k)| k) != Some(&key) {
                break;
            }
            if blk.refs == 0 {
                if parked_budget == 0 {
                    break;
                }
                parked_budget -= 1;
            }
            out.push(b);
            parent = h;
        }
        out
    }

    /// Gives an empty `slot` the registered blocks `prompt` starts with; returns the positions
    /// it now holds (a multiple of [`PAGE`]).
    pub fn adopt(&mut self, slot: usize, prompt: &[u32], adapter: Option<u32>) -> usize {
        if !self.table(slot).is_empty() {
            return 0;
        }
        let chain = self.chain(prompt, adapter);
        for &b in &chain {
            let blk = &mut self.blocks[b as usize];
            if blk.refs == 0 {
                self.evictable.remove(&blk.parked);
            }
            blk.refs += 1;
        }
        let n = chain.len() * PAGE;
        if let Some(t) = self.tables.get_mut(slot) {
            *t = chain;
        }
        n
    }

    /// Ends `slot`'s sequence: its blocks are released (registered ones stay cached) and its
    /// reservation dropped.
    pub fn release(&mut self, slot: usize) {
        let table = std::mem::take(&mut self.tables[slot]);
        for b in table {
            self.unref(b);
        }
        self.reserved_total -= self.reserved[slot];
        self.reserved[slot] = 0;
    }

    /// Takes every slot's whole table of `slot_blocks` blocks in slot order (for a run that
    /// addresses the caches by slot, the agent VM's GPU plan): slot `s` gets blocks
    /// `s * slot_blocks ..`. The pool must be untouched and large enough.
    pub fn take_contiguous(&mut self, slot_blocks: usize) -> Result<(), KvFull> {
        let n = self.tables.len() * slot_blocks;
        if self.free.len() != self.blocks.len() || n > self.blocks.len() {
            return Err(self.full(n, self.free.len()));
        }
        for (s, t) in self.tables.iter_mut().enumerate() {
            *t = (0..slot_blocks)
                .map(|i| (s * slot_blocks + i) as u32)
                .collect();
        }
        for b in &mut self.blocks[..n] {
            b.refs = 1;
        }
        self.free.retain(|&b| b as usize >= n);
        Ok(())
    }

    fn full(&self, need: usize, available: usize) -> KvFull {
        KvFull {
            need,
            available,
            total: self.blocks.len(),
        }
    }

    /// A block for a table: a free one, else the least recently parked registered one.
    fn take(&mut self) -> Option<u32> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.evictable.pop_first()?;
                self.unregister(b);
                self.stats.evicted += 1;
                b
            }
        };
        self.blocks[b as usize].refs = 1;
        Some(b)
    }

    fn unref(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        blk.refs = blk.refs.saturating_sub(1);
        if blk.refs > 0 {
            return;
        }
        if blk.key.is_some() {
            self.clock += 1;
            blk.parked = self.clock;
            self.evictable.insert(self.clock, b);
        } else {
            self.free.push(b);
        }
    }

    fn unregister(&mut self, b: u32) {
        if let Some((h, _)) = self.blocks[b as usize].key.take() {
            if self.index.get(&h) == Some(&b) {
                self.index.remove(&h);
            }
        }
    }
}

#[cfg(test)]
#[path = "kv_pool_tests.rs"]
mod tests;
