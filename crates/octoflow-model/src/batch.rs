//! Many sequences in one step: the interface a serving scheduler drives.
//!
//! A [`BatchForward`] holds `n_slots` independent sequences (each with its own KV cache of
//! `n_ctx` positions) over one copy of the weights. Each step runs a list of [`BatchRow`]s —
//! any mix of decode tokens of many slots and prompt chunks of some — through one forward
//! pass: matrix kernels over all rows, attention per row against its own slot's cache.
//!
//! Steps are pipelined: [`BatchForward::submit`] queues a step and returns; a row may take its
//! token from what the previous step sampled for the same slot ([`TokenIn::Sampled`]), so the
//! next step can be submitted before the previous one's results are read
//! ([`BatchForward::collect`]). At most [`BatchForward::MAX_IN_FLIGHT`] steps are in flight.

use octoflow_core::{Draw, TokenMask};

use crate::config::ModelConfig;
use crate::error::Result;

/// Steps that may be submitted and not yet collected.
pub const MAX_IN_FLIGHT: usize = 2;

/// Where a row's input token comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenIn {
    /// This id.
    Id(u32),
    /// The token sampled for the same slot by the most recent submitted step (whose row of that
    /// slot asked for [`RowOutput::Sample`]).
    Sampled,
}

/// What a row wants back after its token has run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowOutput {
    /// Nothing (a prompt token before the last).
    None,
    /// The next token, drawn on the device with these parameters
    /// ([`BatchForward::device_samples`] must hold; `draw.step` is this draw's counter).
    Sample(Draw),
    /// The row's logits `[n_vocab]` (for CPU sampling: penalties, logprobs).
    Logits,
}

/// One token of one sequence in a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchRow {
    /// The sequence (`0..n_slots`).
    pub slot: u32,
    /// Its position in the sequence. The first row of a slot in a step at position `p` forgets
    /// whatever the slot cached from `p` on; the slot's rows in one step are at consecutive
    /// positions, in order.
    pub pos: u32,
    /// The input token.
    pub token: TokenIn,
    /// What comes back.
    pub output: RowOutput,
    /// The loaded LoRA adapter this row runs with (index into the model's adapters; `None`:
    /// the base model). A slot's rows must all name the same one.
    pub adapter: Option<u32>,
}

/// A row's result, in the order of the step's rows.
#[derive(Debug, Clone, PartialEq)]
pub enum RowResult {
    /// The row asked for nothing.
    None,
    /// The token sampled on the device, with its log-probability at temperature 1
    /// (`log softmax(logits)[token]`, octoflow-core `sampling::logprob`; the GPU sums in
    /// another order, so engines agree on it to rounding, not bit for bit).
    Token { token: u32, logprob: f32 },
    /// `[n_vocab]` logits.
    Logits(Vec<f32>),
}

/// KV memory of an engine with a shared pool, in positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRoom {
    /// What a new promise ([`BatchForward::reserve`]) may still take.
    pub available: usize,
    /// The whole pool.
    pub total: usize,
    /// Positions held by registered prefixes (in use or not).
    pub cached: usize,
}

/// Many sequences over one copy of the weights, run in batched, pipelined steps.
pub trait BatchForward {
    /// The model's hyper-parameters.
    fn config(&self) -> &ModelConfig;

    /// Sequences held.
    fn n_slots(&self) -> usize;

    /// Positions each sequence can hold.
    fn n_ctx(&self) -> usize;

    /// Most rows per step.
    fn max_rows(&self) -> usize;

    /// Whether a row may ask for [`RowOutput::Sample`] with `draw` (else it asks for logits).
    fn device_samples(&self, draw: &Draw) -> bool;

    /// Queues one step (validating it first: slots, positions within `n_ctx`, consecutive
    /// positions per slot, token ids, row count, [`TokenIn::Sampled`] only after a sampled row
    /// of that slot). Errors if [`MAX_IN_FLIGHT`] steps are already pending.
    fn submit(&mut self, rows: &[BatchRow]) -> Result<()>;

    /// Whether [`BatchForward::submit_masked`] takes masks (a grammar's token mask applied
    /// where the device draws).
    fn device_masks(&self) -> bool {
        false
    }

    /// [`BatchForward::submit`] where the draw of row `i` (a [`RowOutput::Sample`] row) takes
    /// only the tokens `masks[i]` allows (a grammar's mask, octoflow-core `TokenMask` words;
    /// `None` or past the end: unconstrained). The token comes back as any draw's; its
    /// log-probability is the model's, over every token. Engines that cannot mask refuse a
    /// step with a mask.
    fn submit_masked(&mut self, rows: &[BatchRow], masks: &[Option<&TokenMask>]) -> Result<()> {
        if masks.iter().any(Option::is_some) {
            return Err(crate::error::ModelError::Batch(
                "this engine draws no masked tokens".into(),
            ));
        }
        self.submit(rows)
    }

    /// Whether [`BatchForward::submit_late`] takes rows whose masks come after the submit.
    fn late_masks(&self) -> bool {
        false
    }

    /// [`BatchForward::submit_masked`], except that the draws of the rows with `late[i]` set
    /// wait for masks the caller gives with [`BatchForward::give_masks`] after this call, while
    /// the step's forward pass runs (a grammar's next mask, known once the previous step's
    /// token is read: such a row can take that token as [`TokenIn::Sampled`]). The masks are
    /// due before the step is collected and before the next submit: collecting the step
    /// without them is an error (its late rows then drew unconstrained).
    fn submit_late(
        &mut self,
        rows: &[BatchRow],
        masks: &[Option<&TokenMask>],
        late: &[bool],
    ) -> Result<()> {
        if late.iter().any(|&l| l) {
            return Err(crate::error::ModelError::Batch(
                "this engine takes no masks after a submit".into(),
            ));
        }
        self.submit_masked(rows, masks)
    }

    /// The masks of the last submitted step's late rows, one per late row in row order
    /// (`None`: that row draws unconstrained).
    fn give_masks(&mut self, _masks: &[Option<&TokenMask>]) -> Result<()> {
        Err(crate::error::ModelError::Batch(
            "no step waits for masks".into(),
        ))
    }

    /// Waits for the oldest pending step and returns one result per row, in row order.
    fn collect(&mut self) -> Result<Vec<RowResult>>;

    /// Steps submitted and not yet collected.
    fn pending(&self) -> usize;

    /// Positions of `prompt` (run with `adapter`) that a new sequence in `slot` would find
    /// already cached ([`BatchForward::reuse`]); 0 where nothing is.
    fn reusable(&self, _slot: u32, _prompt: &[u32], _adapter: Option<u32>) -> usize {
        0
    }

    /// Starts a new sequence in `slot` whose prompt is `prompt`: whatever the slot held is
    /// released, and the longest cached start of the prompt (never its last token, which must
    /// run to give the first token's logits) is placed in it. Returns the positions the slot
    /// now holds: the sequence's first row is at that position.
    fn reuse(&mut self, _slot: u32, _prompt: &[u32], _adapter: Option<u32>) -> usize {
        0
    }

    /// Records that `slot`'s positions `0..tokens.len()` hold `tokens` (run with `adapter`),
    /// so that later sequences may reuse them. The caller vouches for the tokens; positions
    /// past what the slot holds are ignored.
    fn hold(&mut self, _slot: u32, _tokens: &[u32], _adapter: Option<u32>) {}

    /// Ends `slot`'s sequence: its KV memory goes back to the engine (what [`Self::hold`]
    /// recorded stays reusable while the memory is not needed).
    fn release(&mut self, _slot: u32) {}

    /// Promises `slot` KV memory for `positions` positions (what it already holds included),
    /// replacing an earlier promise, or says the engine has not that much left.
    fn reserve(&mut self, _slot: u32, _positions: usize) -> Result<()> {
        Ok(())
    }

    /// KV memory left for new promises and in all, in positions (`None`: every slot holds a
    /// whole context of its own).
    fn kv_room(&self) -> Option<KvRoom> {
        None
    }

    /// Submits one step and waits for it (after collecting nothing else: `pending()` must be 0).
    fn step(&mut self, rows: &[BatchRow]) -> Result<Vec<RowResult>> {
        self.submit(rows)?;
        self.collect()
    }
}
