//! [`BatchForward`] on the CPU reference: one [`Session`] per slot.
//!
//! A step's rows are grouped by slot; each group runs as one [`Session::forward`] call at the
//! position of its first row (so a prompt chunk reads the weights once per layer). Rows that ask
//! for [`RowOutput::Sample`] are drawn with the CPU sampler ([`Draw::sample_cpu`]), which is
//! the specification the GPU sampler follows, so both give the same token for the same logits;
//! they take the draws the GPU takes, so a scheduler decides alike over either. [`BatchForward::submit`] computes the step
//! at once and queues its results for [`BatchForward::collect`].
//!
//! Prompt reuse is per slot: a session keeps what it ran, so a new sequence in a slot whose
//! held tokens start its prompt skips them (the slot with the longest such start is the one
//! to give it, [`BatchForward::reusable`]); there is no pool to share blocks between slots.

use std::collections::VecDeque;

use octoflow_core::{Draw, TokenMask};

use crate::batch::{BatchForward, BatchRow, RowOutput, RowResult, TokenIn, MAX_IN_FLIGHT};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::forward::{Logits, Session};
use crate::model::Model;

/// Many sequences on the CPU reference, one KV cache each.
pub struct CpuBatch<'m> {
    model: &'m Model,
    sessions: Vec<Session<'m>>,
    n_ctx: usize,
    max_rows: usize,
    /// Per slot: the token its last row sampled in the most recent submitted step.
    sampled: Vec<Option<u32>>,
    /// Results of submitted, not yet collected steps, oldest first.
    done: VecDeque<Vec<RowResult>>,
    /// Per slot: the tokens [`BatchForward::hold`] said its session holds at its first
    /// positions, and their adapter (cut wherever a later row overwrote them).
    held: Vec<(Vec<u32>, Option<u32>)>,
}

impl<'m> CpuBatch<'m> {
    /// `n_slots` sequences of `n_ctx` positions each, at most `max_rows` rows per step.
    pub fn new(model: &'m Model, n_slots: usize, n_ctx: usize, max_rows: usize) -> Self {
        Self {
            model,
            sessions: (0..n_slots).map(|_| model.session(n_ctx)).collect(),
            n_ctx,
            max_rows: max_rows.max(1),
            sampled: vec![None; n_slots],
            done: VecDeque::new(),
            held: vec![(Vec::new(), None); n_slots],
        }
    }

    /// Checks a step against the interface's rules; returns the rows grouped by slot (slot,
    /// indices into `rows`), in order of each slot's first row.
    fn validate(&self, rows: &[BatchRow]) -> Result<Vec<(usize, Vec<usize>)>> {
        let bad = |msg: String| Err(ModelError::Batch(msg));
        if self.done.len() >= MAX_IN_FLIGHT {
            return bad(format!(
                "{MAX_IN_FLIGHT} steps are already in flight; collect one before submitting"
            ));
        }
        if rows.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        if let Some(r) = rows.iter().find(|r| r.adapter.is_some()) {
            return bad(format!(
                "slot {}: LoRA adapters are applied on the GPU only (the CPU reference merges them at load)",
                r.slot
            ));
        }
        if rows.len() > self.max_rows {
            return bad(format!(
                "{} rows in one step, at most {} allowed",
                rows.len(),
                self.max_rows
            ));
        }
        let n_vocab = self.model.config.n_vocab;
        let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let slot = row.slot as usize;
            if slot >= self.sessions.len() {
                return bad(format!(
                    "row {i}: slot {slot} does not exist ({} slots)",
                    self.sessions.len()
                ));
            }
            let pos = row.pos as usize;
            if pos >= self.n_ctx {
                return bad(format!(
                    "row {i}: position {pos} is outside slot {slot}'s context of {} positions",
                    self.n_ctx
                ));
            }
            match row.token {
                TokenIn::Id(id) if id as usize >= n_vocab => {
                    return bad(format!(
                        "row {i}: token id {id} is outside the vocabulary (n_vocab = {n_vocab})"
                    ));
                }
                _ => {}
            }
            if let RowOutput::Sample(draw) = &row.output {
                if !self.device_samples(draw) {
                    return bad(format!(
                        "row {i}: the device sampler cannot draw with temperature {} and top_k {} \
                         (ask for logits instead)",
                        draw.temperature, draw.top_k
                    ));
                }
            }
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, idx)) => {
                    let prev = rows[idx[idx.len() - 1]].pos as usize;
                    if pos != prev + 1 {
                        return bad(format!(
                            "row {i}: slot {slot} is at position {pos} after position {prev} \
                             (a slot's rows must be at consecutive positions, in order)"
                        ));
                    }
                    if row.token == TokenIn::Sampled {
                        return bad(format!(
                            "row {i}: TokenIn::Sampled is only allowed on a slot's first row of \
                             a step (slot {slot})"
                        ));
                    }
                    idx.push(i);
                }
                None => {
                    let cached = self.sessions[slot].n_past();
                    if pos > cached {
                        return bad(format!(
                            "row {i}: slot {slot} starts at position {pos}, past the {cached} \
                             positions it holds"
                        ));
                    }
                    if row.token == TokenIn::Sampled && self.sampled[slot].is_none() {
                        return bad(format!(
                            "row {i}: TokenIn::Sampled for slot {slot}, but the previous step \
                             sampled no token for it"
                        ));
                    }
                    groups.push((slot, vec![i]));
                }
            }
        }
        Ok(groups)
    }
}

impl BatchForward for CpuBatch<'_> {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn n_slots(&self) -> usize {
        self.sessions.len()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn max_rows(&self) -> usize {
        self.max_rows
    }

    fn device_samples(&self, draw: &Draw) -> bool {
        octoflow_kernels::Sample::supports(draw.temperature, draw.top_k)
    }

    fn submit(&mut self, rows: &[BatchRow]) -> Result<()> {
        self.submit_masked(rows, &[])
    }

    fn reusable(&self, slot: u32, prompt: &[u32], adapter: Option<u32>) -> usize {
        match self.held.get(slot as usize) {
            Some((tokens, a)) if *a == adapter => {
                let same = tokens
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                same.min(prompt.len().saturating_sub(1))
            }
            _ => 0,
        }
    }

    fn reuse(&mut self, slot: u32, prompt: &[u32], adapter: Option<u32>) -> usize {
        let n = self.reusable(slot, prompt, adapter);
        if let Some(h) = self.held.get_mut(slot as usize) {
            h.0.truncate(n);
        }
        if let Some(s) = self.sessions.get_mut(slot as usize) {
            s.truncate(n);
        }
        n
    }

    fn hold(&mut self, slot: u32, tokens: &[u32], adapter: Option<u32>) {
        if let (Some(h), Some(s)) = (
            self.held.get_mut(slot as usize),
            self.sessions.get(slot as usize),
        ) {
            *h = (tokens[..tokens.len().min(s.n_past())].to_vec(), adapter);
        }
    }

    fn device_masks(&self) -> bool {
        true
    }

    fn submit_masked(&mut self, rows: &[BatchRow], masks: &[Option<&TokenMask>]) -> Result<()> {
        let groups = self.validate(rows)?;
        let n_vocab = self.model.config.n_vocab;
        let mut results = vec![RowResult::None; rows.len()];
        let mut sampled = vec![None; self.sessions.len()];
        for (slot, idx) in &groups {
            let tokens: Vec<u32> = idx
                .iter()
                .map(|&i| match rows[i].token {
                    TokenIn::Id(id) => id,
                    // Validated: the previous step sampled for this slot.
                    TokenIn::Sampled => self.sampled[*slot].unwrap_or(0),
                })
                .collect();
            let wants: Vec<bool> = idx
                .iter()
                .map(|&i| rows[i].output != RowOutput::None)
                .collect();
            let mode = if !wants.iter().any(|&w| w) {
                Logits::None
            } else if wants[..wants.len() - 1].iter().any(|&w| w) {
                Logits::All
            } else {
                Logits::Last
            };
            let start = rows[idx[0]].pos as usize;
            self.held[*slot].0.truncate(start);
            let logits = self.sessions[*slot].forward(&tokens, start, mode)?;
            for (k, &i) in idx.iter().enumerate() {
                let row_logits = match mode {
                    Logits::None => continue,
                    Logits::Last if k + 1 == idx.len() => &logits[..n_vocab],
                    Logits::Last => continue,
                    Logits::All => &logits[k * n_vocab..(k + 1) * n_vocab],
                };
                results[i] = match &rows[i].output {
                    RowOutput::None => RowResult::None,
                    RowOutput::Logits => RowResult::Logits(row_logits.to_vec()),
                    RowOutput::Sample(draw) => {
                        let t = match masks.get(i).copied().flatten() {
                            Some(mask) => draw.sample_cpu_masked(row_logits, mask),
                            None => draw.sample_cpu(row_logits),
                        };
                        sampled[*slot] = Some(t);
                        RowResult::Token {
                            token: t,
                            logprob: octoflow_core::sampling::logprob(row_logits, t),
                        }
                    }
                };
            }
            // Only a sample on the slot's last row can feed its next step.
            if !matches!(rows[idx[idx.len() - 1]].output, RowOutput::Sample(_)) {
                sampled[*slot] = None;
            }
        }
        self.sampled = sampled;
        self.done.push_back(results);
        Ok(())
    }

    fn collect(&mut self) -> Result<Vec<RowResult>> {
        self.done
            .pop_front()
            .ok_or_else(|| ModelError::Batch("collect with no step in flight".into()))
    }

    fn pending(&self) -> usize {
        self.done.len()
    }
}

#[cfg(test)]
#[path = "cpu_batch_tests.rs"]
mod tests;
