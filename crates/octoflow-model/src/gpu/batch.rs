//! [`GpuBatch`]: many sequences over one copy of the weights, each step one chain.
//!
//! Every layer's KV cache is one pool of blocks of [`PAGE`] rows ([`KvPool`]): a slot's block
//! table grows as its rows reach new blocks, sequences may share registered blocks (a cached
//! prefix, [`BatchForward::reuse`]), and the pool holds as many positions as it was given
//! (`kv_positions`), not `slots × n_ctx`. One extra block after the pool takes the writes of
//! padding rows. A step's rows are described to the GPU by a per-row (position, block table
//! offset) table ([`Positions::Table`]) followed by the block tables of the step's slots, so
//! one recording serves any mix of slots and positions with the same row count: the matrix
//! kernels run over all rows, attention reads each row's own blocks.
//!
//! Row counts are rounded up to a few buckets (padding rows are harmless), so a handful of
//! chains are recorded per model. Host-written inputs and host-read outputs come in two sets
//! used alternately, so step `N + 1` is written and submitted while step `N` runs; a row may
//! take its token from the previous step's sample without the CPU reading it
//! ([`TokenIn::Sampled`], resolved on the GPU by `pick_ids`). Blocks freed by step `N + 1`'s
//! bookkeeping are only written by later steps, which run after step `N` (each chain starts
//! with a barrier), so a block is never reused under a step still reading it.
//!
//! Per step: pick ids → embeddings → layers → gather the rows that want output → final norm →
//! logits → one sampling workgroup per output row (per-row [`SamplerState`]; in a step where
//! some row draws under a grammar, the masked sampler with a per-row token mask, unconstrained
//! rows flagged so it skips their masks) → (if any row wants logits) a copy of the logits to
//! host memory.
//!
//! A step with late masks ([`BatchForward::submit_late`]) is two chains: everything up to the
//! logits, then (held by a host-signalled [`Timeline`] until [`BatchForward::give_masks`]
//! wrote the masks) the masked draw and the rest, so the host computes a grammar's next mask
//! while the GPU runs the step's layers.

use std::collections::{HashMap, VecDeque};

use octoflow_core::{Draw, TokenMask};
use octoflow_kernels::linear::MATVEC_MAX_TOKENS;
use octoflow_kernels::{mask_row_words, Sample, SamplerState, FROM_PREV};
use octoflow_vk::{summarize, Buffer, BufferSlice, Chain, LabelTime, MemoryKind, Timeline};

use crate::batch::{BatchForward, BatchRow, KvRoom, RowOutput, RowResult, TokenIn, MAX_IN_FLIGHT};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::gpu::scratch::{Scratch, SAMPLER_WORDS};
use crate::gpu::GpuModel;
use crate::kv_pool::{blocks_for, KvPool, PAGE};

#[path = "batch_kv.rs"]
mod kv;
#[path = "batch_record.rs"]
mod record;

/// The row count a step with `n` rows is recorded for (at most `max`).
fn bucket(n: u32, max: u32) -> u32 {
    let b = if n <= 16 {
        n.next_power_of_two()
    } else {
        n.next_multiple_of(16)
    };
    b.min(max).max(n)
}

/// Host-written inputs and host-read outputs of one step in flight.
struct IoSet {
    /// `[max_rows, 2]` u32: (position, block table offset) per row, then from word
    /// `2 max_rows` the padding rows' one-block table and the step's slots' block tables.
    table: Buffer,
    /// `[max_rows]` u32: ids, or `FROM_PREV | index` into the other set's `tokens`.
    src_ids: Buffer,
    /// `[max_out]` u32: the rows whose logits are computed.
    out_rows: Buffer,
    /// `[max_rows]` u32: each row's adapter mix (`GpuAdapters::mix_of`).
    mix: Buffer,
    /// `[max_out]` sampler states.
    states: Buffer,
    /// `[2, max_out]` u32: tokens sampled per output row, then their log-probabilities' f32
    /// bits (one buffer, so one read brings both back).
    tokens: Buffer,
    /// `[max_out, n_vocab]` f32 logits for the host, allocated on first need.
    logits: Option<Buffer>,
    /// `[max_out, mask_row_words(n_vocab)]` u32 token masks per output row (a flag word, then
    /// the bits), allocated at the first masked step.
    masks: Option<Buffer>,
}

/// The tables a step's forward pass reads and writes, on the device (see [`GpuBatch::record_rows`]).
pub struct DeviceRows {
    /// `[rows, 2]` u32: (position, block table offset) per row, and the block tables the
    /// offsets name (`octoflow_kernels::page`).
    pub table: BufferSlice,
    /// `[rows]` u32: the rows' token ids.
    pub ids: BufferSlice,
    /// `[n_out]` u32: the rows whose logits are computed and sampled.
    pub out_rows: BufferSlice,
    /// `[rows]` u32: each row's adapter mix (0: the base model).
    pub mix: BufferSlice,
    /// `[n_out]` sampler states ([`SamplerState`], 8 words each).
    pub states: BufferSlice,
    /// u32: the sampled tokens at `0..n_out`, and the f32 bits of their log-probabilities at
    /// `logprobs_at..logprobs_at + n_out` (the sampler writes both; `logprobs_at >= n_out`).
    pub tokens: BufferSlice,
    /// Where the log-probabilities start in `tokens`: the buffer's fixed half, whatever a
    /// step's `n_out` (the readers index it by output row).
    pub logprobs_at: u32,
    /// `[n_out, mask_row_words(n_vocab)]` u32: each output row's token mask (flag word 0:
    /// none), or `None` for steps without grammars (the plain sampler).
    pub mask: Option<BufferSlice>,
}

/// Chain cache key: what a step's recording depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    /// The row bucket.
    rows: u32,
    /// The output-row bucket.
    out: u32,
    /// Logits copied to the host.
    logits: bool,
    /// The io set.
    set: usize,
    /// A masked sampler.
    masked: bool,
    /// Masks given after the submit.
    late: bool,
    /// Every row samples a token ([`Graph::decode`](crate::gpu::graph::Graph)); only where the
    /// products depend on it (buckets of 2 ..= [`MATVEC_MAX_TOKENS`] rows), else false.
    decode: bool,
}

impl Key {
    /// Whether a step of `rows` rows in a bucket of `nb`, whose every row samples where
    /// `all_sample`, records as decode rows.
    fn decode_rows(nb: u32, all_sample: bool) -> bool {
        all_sample && (2..=MATVEC_MAX_TOKENS).contains(&nb)
    }
}

/// A step's recording: one chain, or (late masks) the forward pass and the draw held for the
/// host's signal.
struct StepChain {
    head: Chain,
    tail: Option<Chain>,
}

/// A step submitted and not yet collected.
struct Pending {
    key: Key,
    /// Per row: `Some(i)` when the row asked for output `i` (index into the output rows).
    outputs: Vec<Option<(u32, bool)>>,
    n_out: u32,
    /// The timeline value its draw waits for (late masks).
    signal: Option<u64>,
}

/// The late masks the last submitted step still waits for.
struct Owed {
    /// The timeline value that releases the step's draw.
    value: u64,
    set: usize,
    /// The late rows' output indices, in row order.
    outs: Vec<u32>,
}

/// Many sequences on the GPU, run in batched, pipelined steps ([`BatchForward`]).
pub struct GpuBatch<'m> {
    model: &'m GpuModel,
    s: Scratch,
    n_slots: u32,
    n_ctx: u32,
    max_out: u32,
    ids: Buffer,
    sets: [IoSet; 2],
    next_set: usize,
    pending: VecDeque<Pending>,
    chains: HashMap<Key, StepChain>,
    /// What holds late-masked draws (made at the first such step), the last value given out,
    /// and the masks still due.
    timeline: Option<Timeline>,
    signals: u64,
    owed: Option<Owed>,
    /// Positions cached per slot (after every submitted step).
    cached: Vec<u32>,
    /// Per slot: the output index of its sample in the last submitted step, if it sampled.
    sampled: Vec<Option<u32>>,
    /// Which blocks each slot uses.
    pool: KvPool,
    /// Words of each set's table buffer (pairs, then block tables).
    table_words: u32,
    profile: bool,
    last_profile: Option<Vec<LabelTime>>,
}

impl GpuModel {
    /// `n_slots` sequences of up to `n_ctx` positions each, stepped `max_rows` rows at a time,
    /// with KV blocks for every slot's whole context.
    pub fn batch(&self, n_slots: usize, n_ctx: usize, max_rows: usize) -> Result<GpuBatch<'_>> {
        let positions = n_slots.saturating_mul(blocks_for(n_ctx) * PAGE);
        self.batch_with(n_slots, n_ctx, max_rows, positions)
    }

    /// [`GpuModel::batch`] with a KV pool of `kv_positions` positions (rounded up to whole
    /// blocks) shared by the slots: at least one whole context.
    pub fn batch_with(
        &self,
        n_slots: usize,
        n_ctx: usize,
        max_rows: usize,
        kv_positions: usize,
    ) -> Result<GpuBatch<'_>> {
        let too_big = |what: &str| ModelError::Gpu(format!("{what} is too large"));
        let n_blocks = blocks_for(kv_positions);
        let slot_blocks = blocks_for(n_ctx);
        let n_slots = u32::try_from(n_slots).map_err(|_| too_big("the slot count"))?;
        let n_ctx = u32::try_from(n_ctx).map_err(|_| too_big("the context size"))?;
        let max_rows = u32::try_from(max_rows).map_err(|_| too_big("the row count"))?;
        if n_slots == 0 || n_ctx == 0 || max_rows == 0 {
            return Err(ModelError::Gpu(format!(
                "a batch needs slots, positions and rows (got {n_slots}, {n_ctx}, {max_rows})"
            )));
        }
        if n_blocks < slot_blocks {
            return Err(ModelError::Batch(format!(
                "a KV cache of {kv_positions} positions cannot hold one context of {n_ctx}"
            )));
        }
        let kv_rows = u32::try_from((n_blocks + 1) * PAGE).map_err(|_| too_big("the KV cache"))?;
        // block tables of the slots one step can name, after the row pairs and the padding
        // rows' one-word table
        let table_words = (slot_blocks as u64)
            .checked_mul(u64::from(n_slots.min(max_rows)))
            .and_then(|w| w.checked_add(2 * u64::from(max_rows) + 1))
            .and_then(|w| u32::try_from(w).ok())
            .ok_or_else(|| too_big("the block tables"))?;
        let ctx = self.context();
        let s = Scratch::new(
            ctx,
            &self.config,
            kv_rows,
            max_rows,
            max_rows,
            1,
            self.lora_r(),
            self.kv_type,
        )?;
        let max_out = s.t_logits.min(max_rows);
        let host = |name: &str, words: u32, kind: MemoryKind| {
            Buffer::new(ctx, name, 4 * u64::from(words.max(1)), kind)
        };
        let set = |i: usize| -> Result<IoSet> {
            Ok(IoSet {
                table: host(&format!("batch_table.{i}"), table_words, MemoryKind::Upload)?,
                src_ids: host(&format!("batch_ids.{i}"), max_rows, MemoryKind::Upload)?,
                out_rows: host(&format!("batch_out_rows.{i}"), max_out, MemoryKind::Upload)?,
                mix: host(&format!("batch_mix.{i}"), max_rows, MemoryKind::Upload)?,
                states: host(
                    &format!("batch_states.{i}"),
                    max_out * SAMPLER_WORDS as u32,
                    MemoryKind::Upload,
                )?,
                tokens: host(
                    &format!("batch_tokens.{i}"),
                    2 * max_out,
                    MemoryKind::Readback,
                )?,
                logits: None,
                masks: None,
            })
        };
        Ok(GpuBatch {
            model: self,
            ids: host("batch_ids", max_rows, MemoryKind::DeviceLocal)?,
            sets: [set(0)?, set(1)?],
            s,
            n_slots,
            n_ctx,
            max_out,
            next_set: 0,
            pending: VecDeque::new(),
            chains: HashMap::new(),
            timeline: None,
            signals: 0,
            owed: None,
            cached: vec![0; n_slots as usize],
            sampled: vec![None; n_slots as usize],
            pool: KvPool::new(n_blocks, n_slots as usize, true),
            table_words,
            profile: false,
            last_profile: None,
        })
    }
}

impl GpuBatch<'_> {
    /// Device bytes of this batch's buffers (KV caches of every slot, activations, logits).
    pub fn bytes(&self) -> u64 {
        let sets: u64 = self
            .sets
            .iter()
            .map(|s| {
                [
                    &s.table,
                    &s.src_ids,
                    &s.out_rows,
                    &s.mix,
                    &s.states,
                    &s.tokens,
                ]
                .iter()
                .map(|b| b.size())
                .sum::<u64>()
                    + s.logits.as_ref().map_or(0, |b| b.size())
            })
            .sum();
        self.s.bytes() + self.ids.size() + sets
    }

    /// Records chains with GPU timestamps from now on (none may be in flight); [`Self::profile`]
    /// then reports the last collected step's time per kernel.
    pub fn set_profiling(&mut self, on: bool) -> Result<()> {
        if !self.pending.is_empty() {
            return Err(ModelError::Batch(
                "profiling changed with steps in flight".into(),
            ));
        }
        if on && !self.model.ctx.caps().timestamps {
            return Err(ModelError::Gpu(format!(
                "{} has no compute timestamps; profiling is unavailable",
                self.model.ctx.caps().name
            )));
        }
        if on != self.profile {
            self.chains.clear();
        }
        self.profile = on;
        Ok(())
    }

    /// GPU time per kernel of the last collected step (with profiling on).
    pub fn profile(&self) -> Option<&[LabelTime]> {
        self.last_profile.as_deref()
    }

    /// Most rows per step that may ask for output (logits fit one binding).
    pub fn max_outputs(&self) -> usize {
        self.max_out as usize
    }

    /// Writes output rows' masks into set `set`'s mask buffer: per (output row, mask) its flag
    /// word, then the bits (`None`: flag 0, unconstrained; the kernel skips its bits).
    fn write_masks<'a>(
        &self,
        set: usize,
        rows: impl IntoIterator<Item = (u32, Option<&'a TokenMask>)>,
    ) -> Result<()> {
        let n_vocab = self.model.config.n_vocab as u32;
        let words = mask_row_words(n_vocab) as usize;
        let buf = self.sets[set]
            .masks
            .as_ref()
            .ok_or_else(|| ModelError::Gpu("the mask buffer was not allocated".into()))?;
        for (o, m) in rows {
            let at = 4 * (o as usize * words) as u64;
            match m {
                Some(m) if m.words().len() + 1 == words => {
                    buf.write(at, &[1u32])?;
                    buf.write(at + 4, m.words())?;
                }
                Some(m) => {
                    return Err(ModelError::Batch(format!(
                        "a token mask of {} tokens for a vocabulary of {n_vocab}",
                        m.n_vocab()
                    )))
                }
                None => buf.write(at, &[0u32])?,
            }
        }
        Ok(())
    }

    /// Writes the late rows' masks.
    fn write_late_masks(&self, owed: &Owed, masks: &[Option<&TokenMask>]) -> Result<()> {
        self.write_masks(
            owed.set,
            owed.outs.iter().copied().zip(masks.iter().copied()),
        )
    }

    /// Lets the draw held for `value` run.
    fn release_draw(&self, value: u64) -> Result<()> {
        let t = self
            .timeline
            .as_ref()
            .ok_or_else(|| ModelError::Gpu("no timeline holds a draw".into()))?;
        Ok(t.signal(value)?)
    }

    /// Checks a step against the slots' state; returns the slots' cached lengths after it.
    fn validate(&self, rows: &[BatchRow]) -> Result<Vec<u32>> {
        let bad = |i: usize, what: String| ModelError::Batch(format!("row {i}: {what}"));
        if rows.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        if rows.len() > self.s.t_max as usize {
            return Err(ModelError::Batch(format!(
                "{} rows, at most {} per step",
                rows.len(),
                self.s.t_max
            )));
        }
        let n_out = rows.iter().filter(|r| r.output != RowOutput::None).count();
        if n_out > self.max_out as usize {
            return Err(ModelError::Batch(format!(
                "{n_out} rows want output, at most {} per step",
                self.max_out
            )));
        }
        let n_vocab = self.model.config.n_vocab;
        let n_adapters = self.model.adapters().map_or(0, |a| a.n_adapters());
        let mut cached = self.cached.clone();
        let mut last: HashMap<u32, u32> = HashMap::new();
        for (i, r) in rows.iter().enumerate() {
            if r.slot >= self.n_slots {
                return Err(bad(i, format!("slot {} of {}", r.slot, self.n_slots)));
            }
            if r.pos >= self.n_ctx {
                return Err(ModelError::ContextOverflow {
                    needed: r.pos as usize + 1,
                    n_ctx: self.n_ctx as usize,
                });
            }
            let slot = r.slot as usize;
            match last.get(&r.slot) {
                Some(&p) if r.pos != p + 1 => {
                    return Err(bad(
                        i,
                        format!("slot {} jumps from position {p} to {}", r.slot, r.pos),
                    ))
                }
                None if r.pos > cached[slot] => {
                    return Err(bad(
                        i,
                        format!(
                            "slot {} starts at position {} but caches only {}",
                            r.slot, r.pos, cached[slot]
                        ),
                    ))
                }
                _ => {}
            }
            last.insert(r.slot, r.pos);
            cached[slot] = r.pos + 1;
            match r.token {
                TokenIn::Id(id) if id as usize >= n_vocab => {
                    return Err(ModelError::TokenOutOfRange {
                        id,
                        index: i,
                        n_vocab,
                    })
                }
                TokenIn::Sampled if self.sampled[slot].is_none() => {
                    return Err(bad(
                        i,
                        format!(
                        "slot {} takes the sampled token, but the last step sampled none for it",
                        r.slot
                    ),
                    ))
                }
                _ => {}
            }
            if let Some(a) = r.adapter {
                if a as usize >= n_adapters {
                    return Err(bad(i, format!("adapter {a}, {n_adapters} are loaded")));
                }
            }
            if let RowOutput::Sample(d) = r.output {
                if !self.device_samples(&d) {
                    return Err(bad(
                        i,
                        format!(
                            "the GPU sampler does not handle temperature {} with top_k {}",
                            d.temperature, d.top_k
                        ),
                    ));
                }
            }
        }
        Ok(cached)
    }
}

impl BatchForward for GpuBatch<'_> {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn n_slots(&self) -> usize {
        self.n_slots as usize
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx as usize
    }

    fn max_rows(&self) -> usize {
        self.s.t_max as usize
    }

    fn device_samples(&self, draw: &Draw) -> bool {
        Sample::supports(draw.temperature, draw.top_k)
    }

    fn pending(&self) -> usize {
        self.pending.len()
    }

    fn submit(&mut self, rows: &[BatchRow]) -> Result<()> {
        self.submit_masked(rows, &[])
    }

    fn reusable(&self, slot: u32, prompt: &[u32], adapter: Option<u32>) -> usize {
        if slot >= self.n_slots {
            return 0;
        }
        self.pool.lookup(prompt, adapter)
    }

    fn reuse(&mut self, slot: u32, prompt: &[u32], adapter: Option<u32>) -> usize {
        if slot >= self.n_slots {
            return 0;
        }
        self.release(slot);
        let n = self.pool.adopt(slot as usize, prompt, adapter);
        self.cached[slot as usize] = n as u32;
        n
    }

    fn hold(&mut self, slot: u32, tokens: &[u32], adapter: Option<u32>) {
        if let Some(&cached) = self.cached.get(slot as usize) {
            let n = tokens.len().min(cached as usize);
            self.pool.register(slot as usize, &tokens[..n], adapter);
        }
    }

    fn release(&mut self, slot: u32) {
        if let Some(c) = self.cached.get_mut(slot as usize) {
            *c = 0;
            self.pool.release(slot as usize);
        }
    }

    fn reserve(&mut self, slot: u32, positions: usize) -> Result<()> {
        if slot >= self.n_slots {
            return Err(ModelError::Batch(format!(
                "slot {slot} of {}",
                self.n_slots
            )));
        }
        self.pool.reserve(slot as usize, positions)?;
        Ok(())
    }

    fn kv_room(&self) -> Option<KvRoom> {
        Some(KvRoom {
            available: self.pool.available() * PAGE,
            total: self.pool.n_blocks() * PAGE,
            cached: self.pool.cached() * PAGE,
        })
    }

    fn device_masks(&self) -> bool {
        true
    }

    fn submit_masked(&mut self, rows: &[BatchRow], masks: &[Option<&TokenMask>]) -> Result<()> {
        self.submit_late(rows, masks, &[])
    }

    fn late_masks(&self) -> bool {
        self.model.ctx.caps().timeline_semaphore
    }

    fn submit_late(
        &mut self,
        rows: &[BatchRow],
        masks: &[Option<&TokenMask>],
        late: &[bool],
    ) -> Result<()> {
        if self.pending.len() >= MAX_IN_FLIGHT {
            return Err(ModelError::Batch(format!(
                "{MAX_IN_FLIGHT} steps are already in flight: collect one first"
            )));
        }
        if self.owed.is_some() {
            return Err(ModelError::Batch(
                "the last step's late masks were not given".into(),
            ));
        }
        let is_late = |i: usize| {
            late.get(i).copied().unwrap_or(false)
                && matches!(rows.get(i).map(|r| r.output), Some(RowOutput::Sample(_)))
        };
        let any_late = (0..rows.len()).any(is_late);
        if any_late && self.timeline.is_none() {
            self.timeline = Some(Timeline::new(&self.model.ctx)?);
        }
        let cached = self.validate(rows)?;
        let spans = kv::slot_spans(rows);
        self.place(&spans)?;
        let set = self.next_set;
        let n = rows.len() as u32;
        let nb = bucket(n, self.s.t_max);
        // block tables after the row pairs: the padding rows' (the spare block), then each
        // slot's as far as the step reaches
        let tables_at = 2 * self.s.t_max;
        let mut tables = vec![self.pool.n_blocks() as u32];
        let mut table_of: HashMap<u32, u32> = HashMap::new();
        for &(slot, _, last) in &spans {
            table_of.insert(slot, tables_at + tables.len() as u32);
            let t = self.pool.table(slot as usize);
            tables.extend(&t[..blocks_for(last as usize + 1).min(t.len())]);
        }
        if 2 * u64::from(self.s.t_max) + tables.len() as u64 > u64::from(self.table_words) {
            return Err(ModelError::Gpu(
                "the step's block tables overflow their buffer".into(),
            ));
        }
        let mut table = vec![0u32; 2 * nb as usize];
        let mut src = vec![0u32; nb as usize];
        let mut mix = vec![0u32; nb as usize];
        let mut out_rows = Vec::new();
        let mut states = Vec::new();
        // Per output row: its mask, where it samples under one.
        let mut row_masks: Vec<Option<&TokenMask>> = Vec::new();
        let mut late_outs: Vec<u32> = Vec::new();
        let mut outputs = Vec::with_capacity(rows.len());
        let mut want_logits = false;
        for (i, r) in rows.iter().enumerate() {
            table[2 * i] = r.pos;
            table[2 * i + 1] = table_of.get(&r.slot).copied().unwrap_or(tables_at);
            mix[i] = r.adapter.map_or(0, |a| 1 + a);
            src[i] = match r.token {
                TokenIn::Id(id) => id,
                // validated: the slot sampled in the last step
                TokenIn::Sampled => FROM_PREV | self.sampled[r.slot as usize].unwrap_or(0),
            };
            let state = match r.output {
                RowOutput::None => None,
                RowOutput::Sample(d) => Some((SamplerState::from_draw(&d).to_words(), false)),
                RowOutput::Logits => Some((SamplerState::default().to_words(), true)),
            };
            let mask = match r.output {
                RowOutput::Sample(_) => masks.get(i).copied().flatten(),
                _ => None,
            };
            outputs.push(state.map(|(words, logits)| {
                let o = out_rows.len() as u32;
                if is_late(i) {
                    late_outs.push(o);
                }
                out_rows.push(i as u32);
                row_masks.push(mask);
                states.extend(words);
                want_logits |= logits;
                (o, logits)
            }));
        }
        for i in rows.len()..nb as usize {
            table[2 * i + 1] = tables_at; // padding rows write and read the spare block only
        }
        let n_out = out_rows.len() as u32;
        let ob = if n_out == 0 {
            0
        } else {
            bucket(n_out, self.max_out)
        };
        out_rows.resize(ob as usize, 0);
        states.resize(ob as usize * SAMPLER_WORDS as usize, 0);
        let n_vocab = self.model.config.n_vocab as u64;
        let io = &mut self.sets[set];
        if want_logits && io.logits.is_none() {
            io.logits = Some(Buffer::new(
                &self.model.ctx,
                &format!("batch_logits.{set}"),
                4 * u64::from(self.max_out) * n_vocab,
                MemoryKind::Readback,
            )?);
        }
        io.table.write(0, &table)?;
        io.table.write(4 * u64::from(tables_at), &tables)?;
        io.src_ids.write(0, &src)?;
        io.mix.write(0, &mix)?;
        if ob > 0 {
            io.out_rows.write(0, &out_rows)?;
            io.states.write(0, &states)?;
        }
        let masked = any_late || row_masks.iter().any(Option::is_some);
        if masked {
            let words = mask_row_words(n_vocab as u32) as usize;
            if io.masks.is_none() {
                io.masks = Some(Buffer::new(
                    &self.model.ctx,
                    &format!("batch_masks.{set}"),
                    4 * (words as u64) * u64::from(self.max_out),
                    MemoryKind::Upload,
                )?);
            }
            // unconstrained and padding rows get their flag only; late rows' come with
            // `give_masks`
            self.write_masks(
                set,
                (0..ob)
                    .filter(|o| !late_outs.contains(o))
                    .map(|o| (o, row_masks.get(o as usize).copied().flatten())),
            )?;
        }
        let all_sample = rows
            .iter()
            .all(|r| matches!(r.output, RowOutput::Sample(_)));
        let key = Key {
            rows: nb,
            out: ob,
            logits: want_logits,
            set,
            masked,
            late: any_late,
            decode: Key::decode_rows(nb, all_sample),
        };
        if !self.chains.contains_key(&key) {
            if self.chains.len() >= 64 && self.pending.is_empty() {
                self.chains.clear();
            }
            let chain = self.record(key)?;
            self.chains.insert(key, chain);
        }
        let chain = self
            .chains
            .get_mut(&key)
            .ok_or_else(|| ModelError::Gpu("batch chain vanished".into()))?;
        chain.head.submit()?;
        let mut signal = None;
        if let (Some(tail), Some(timeline)) = (chain.tail.as_mut(), self.timeline.as_ref()) {
            let value = self.signals + 1;
            tail.submit_after(timeline, value)?;
            self.signals = value;
            signal = Some(value);
            self.owed = Some(Owed {
                value,
                set,
                outs: late_outs,
            });
        }
        // bookkeeping only once the step is on its way
        self.cached = cached;
        let mut sampled = vec![None; self.n_slots as usize];
        for (r, o) in rows.iter().zip(&outputs) {
            if let (RowOutput::Sample(_), Some((i, _))) = (r.output, o) {
                sampled[r.slot as usize] = Some(*i);
            }
        }
        self.sampled = sampled;
        self.next_set = 1 - set;
        self.pending.push_back(Pending {
            key,
            outputs,
            n_out,
            signal,
        });
        Ok(())
    }

    fn give_masks(&mut self, masks: &[Option<&TokenMask>]) -> Result<()> {
        let owed = self
            .owed
            .take()
            .ok_or_else(|| ModelError::Batch("no step waits for masks".into()))?;
        let written = if masks.len() == owed.outs.len() {
            self.write_late_masks(&owed, masks)
        } else {
            Err(ModelError::Batch(format!(
                "{} late masks for {} late rows",
                masks.len(),
                owed.outs.len()
            )))
        };
        if written.is_err() {
            // never half-written masks: the late rows draw unconstrained (the caller has the
            // error)
            self.write_late_masks(&owed, &vec![None; owed.outs.len()])?;
        }
        self.release_draw(owed.value)?;
        written
    }

    fn collect(&mut self) -> Result<Vec<RowResult>> {
        let p = self
            .pending
            .pop_front()
            .ok_or_else(|| ModelError::Batch("no step in flight to collect".into()))?;
        let mut missing = false;
        if let Some(owed) = self.owed.take_if(|o| Some(o.value) == p.signal) {
            // collected before its masks: release the draw unconstrained rather than hang
            self.write_late_masks(&owed, &vec![None; owed.outs.len()])?;
            self.release_draw(owed.value)?;
            missing = true;
        }
        let chain = self
            .chains
            .get_mut(&p.key)
            .ok_or_else(|| ModelError::Gpu("batch chain vanished".into()))?;
        chain.head.wait()?;
        if let Some(tail) = chain.tail.as_mut() {
            tail.wait()?;
        }
        if self.profile {
            let mut t = chain.head.timings()?.unwrap_or_default();
            if let Some(tail) = chain.tail.as_mut() {
                t.extend(tail.timings()?.unwrap_or_default());
            }
            self.last_profile = Some(summarize(&t));
        }
        if missing {
            return Err(ModelError::Batch(
                "a step was collected before its late masks were given".into(),
            ));
        }
        let io = &self.sets[p.key.set];
        let mut tokens = vec![0u32; p.n_out as usize];
        let mut logprobs = vec![0f32; p.n_out as usize];
        if p.n_out > 0 {
            io.tokens.read(0, &mut tokens)?;
            io.tokens.read(4 * u64::from(self.max_out), &mut logprobs)?;
        }
        let n_vocab = self.model.config.n_vocab;
        let mut out = Vec::with_capacity(p.outputs.len());
        for o in &p.outputs {
            out.push(match *o {
                None => RowResult::None,
                Some((i, false)) => RowResult::Token {
                    token: tokens[i as usize],
                    logprob: logprobs[i as usize],
                },
                Some((i, true)) => {
                    let buf = io.logits.as_ref().ok_or_else(|| {
                        ModelError::Gpu("the host logits buffer was not allocated".into())
                    })?;
                    let mut row = vec![0f32; n_vocab];
                    buf.read(4 * u64::from(i) * n_vocab as u64, &mut row)?;
                    RowResult::Logits(row)
                }
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_cover_the_count_and_stay_within_the_maximum() {
        for max in [1u32, 7, 64, 256] {
            for n in 1..=max {
                let b = bucket(n, max);
                assert!(b >= n && b <= max, "{n} of {max} → {b}");
            }
        }
        assert_eq!(bucket(3, 256), 4);
        assert_eq!(bucket(17, 256), 32);
        assert_eq!(bucket(200, 200), 200); // 208, capped at the maximum
    }
}

#[cfg(test)]
#[path = "warm_tests.rs"]
mod warm_tests;
