//! [`GpuBatch`]'s recordings: the chains of its steps (one per row bucket, output bucket, io set
//! and sampler kind; a late-masked step as a head and a tail held for the host's signal), and the
//! forward pass and draw other recorders reuse ([`GpuBatch::record_rows`]).

use octoflow_kernels::Positions;
use octoflow_vk::{BufferSlice, Chain};

use super::{bucket, DeviceRows, GpuBatch, Key, StepChain};
use crate::error::{ModelError, Result};
use crate::gpu::adapters::MixSource;
use crate::gpu::graph::{Graph, PosSource, TokenSource};

impl GpuBatch<'_> {
    /// Records, before any step, the chains steps will replay, so that no request waits for the
    /// driver to compile pipelines (they are built on first use, per row count) or for a chain
    /// to be recorded. One chain per row bucket up to [`BatchForward::max_rows`], with output
    /// rows for at most one row per slot (the scheduler's steps sample each sequence at most
    /// once): buckets of up to one row per slot are decode steps, recorded for both input sets
    /// as their steps alternate; larger ones are prompt chunks, recorded with one output row (a
    /// request's first step) on the set the next step takes. Together they build every pipeline
    /// a step can use. Returns the number of chains recorded.
    pub fn warm_up(&mut self) -> Result<usize> {
        let t_max = self.s.t_max;
        let out_max = self.n_slots.min(self.max_out);
        let decode_max = bucket(out_max, t_max);
        let mut keys = Vec::new();
        let mut n = 1;
        while n <= t_max {
            let nb = bucket(n, t_max);
            let key = |out, set, decode| Key {
                rows: nb,
                out,
                logits: false,
                set,
                masked: false,
                late: false,
                decode,
            };
            if nb <= decode_max {
                let ob = bucket(nb.min(out_max), self.max_out);
                keys.extend([0, 1].map(|set| key(ob, set, Key::decode_rows(nb, true))));
            } else {
                keys.push(key(1, self.next_set, false));
            }
            n = nb + 1;
        }
        let mut recorded = 0;
        for key in keys {
            if !self.chains.contains_key(&key) {
                let chain = self.record(key)?;
                self.chains.insert(key, chain);
                recorded += 1;
            }
        }
        Ok(recorded)
    }

    /// Records the chain of a step with `n` rows (`n_out` of them with output) on set `set`,
    /// its sampler masked or not; with `late`, as two chains split before the draw.
    pub(super) fn record(&self, key: Key) -> Result<StepChain> {
        let Key {
            rows: n,
            out: n_out,
            logits,
            set,
            masked,
            late,
            decode,
        } = key;
        let m = self.model;
        let io = &self.sets[set];
        let prev = &self.sets[1 - set];
        let k = &m.kernels;
        let new_chain = || -> Result<Chain> {
            Ok(if self.profile {
                Chain::with_profiling(&m.ctx)?
            } else {
                Chain::new(&m.ctx)?
            })
        };
        let mut chain = new_chain()?;
        // orders this step after the previous submit (KV cache, scratch, the previous tokens)
        chain.barrier()?;
        let ids = self.ids.slice(0, 4 * u64::from(n))?;
        k.pick_ids.record(
            &mut chain,
            &io.src_ids.whole(),
            &prev.tokens.whole(),
            self.max_out,
            &ids,
            n,
        )?;
        chain.compute_barrier()?;
        let rows = DeviceRows {
            table: io.table.whole(),
            ids,
            out_rows: io.out_rows.whole(),
            mix: io.mix.whole(),
            states: io.states.whole(),
            tokens: io.tokens.whole(),
            logprobs_at: self.max_out,
            mask: match (masked, &io.masks) {
                (false, _) => None,
                (true, Some(m)) => Some(m.whole()),
                (true, None) => {
                    return Err(ModelError::Gpu("the mask buffer was not allocated".into()))
                }
            },
        };
        let logits_rows = self.record_forward(&mut chain, &rows, n, n_out, decode)?;
        let mut head = None;
        if late {
            chain.finish()?;
            head = Some(chain);
            chain = new_chain()?;
            // the forward pass's writes and the masks the host wrote after the submit
            chain.host_barrier()?;
        }
        if let Some(l) = &logits_rows {
            self.record_draw(&mut chain, &rows, l, n_out)?;
        }
        if let (true, Some(rows)) = (logits, logits_rows) {
            let dst = io.logits.as_ref().ok_or_else(|| {
                ModelError::Gpu("the host logits buffer was not allocated".into())
            })?;
            chain.barrier()?; // the logits' writes before a transfer reads them
            chain.copy(&rows, dst, 0)?;
        }
        chain.finish()?;
        Ok(match head {
            Some(head) => StepChain {
                head,
                tail: Some(chain),
            },
            None => StepChain {
                head: chain,
                tail: None,
            },
        })
    }

    /// Records one step's forward pass over `n` rows described by tables on the device (what
    /// [`Self::record`] fills from the host, or what a GPU-side planner writes): the layers
    /// over every row, then the `n_out` output rows' logits and one sampled token each. Rows
    /// past the step's real count must be padding (the extra KV slot, see the module doc).
    /// Returns the logits rows when there are output rows. The caller orders it after whatever
    /// wrote the tables (a compute barrier) and after the previous step.
    pub fn record_rows(
        &self,
        chain: &mut Chain,
        rows: &DeviceRows,
        n: u32,
        n_out: u32,
    ) -> Result<Option<BufferSlice>> {
        // rows the GPU chose: decode rows and prompt chunks alike
        let logits = self.record_forward(chain, rows, n, n_out, false)?;
        if let Some(l) = &logits {
            self.record_draw(chain, rows, l, n_out)?;
        }
        Ok(logits)
    }

    /// [`Self::record_rows`] up to the output rows' logits (`decode`: every row samples, see
    /// [`Graph::decode`]).
    fn record_forward(
        &self,
        chain: &mut Chain,
        rows: &DeviceRows,
        n: u32,
        n_out: u32,
        decode: bool,
    ) -> Result<Option<BufferSlice>> {
        let m = self.model;
        let graph = Graph {
            k: &m.kernels,
            c: &m.config,
            w: &m.weights,
            s: &self.s,
            pos: PosSource {
                buf: rows.table.clone(),
                offset: 0,
                mode: Positions::Table,
                seq_rows: self.n_ctx,
            },
            lora: m.graph_lora(|_| MixSource {
                ids: rows.mix.clone(),
                offset: 0,
                stride: 1,
            }),
            decode,
        };
        graph.layers(chain, n, &TokenSource::Slice(rows.ids.clone()))?;
        if n_out == 0 {
            return Ok(None);
        }
        graph.output_rows(chain, n_out, &rows.out_rows)?;
        let n_vocab = m.config.n_vocab as u32;
        Ok(Some(
            self.s
                .logits
                .slice(0, 4 * u64::from(n_out) * u64::from(n_vocab))?,
        ))
    }

    /// [`Self::record_rows`]' draw: one token per output row from `logits`.
    fn record_draw(
        &self,
        chain: &mut Chain,
        rows: &DeviceRows,
        logits: &BufferSlice,
        n_out: u32,
    ) -> Result<()> {
        let m = self.model;
        let n_vocab = m.config.n_vocab as u32;
        match &rows.mask {
            None => m.kernels.sample.record_rows(
                chain,
                logits,
                n_vocab,
                n_out,
                &rows.states,
                &rows.tokens,
                0,
                Some(rows.logprobs_at),
            )?,
            Some(mask) => m.kernels.sample.record_rows_masked(
                chain,
                logits,
                n_vocab,
                n_out,
                &rows.states,
                &rows.tokens,
                0,
                Some(rows.logprobs_at),
                mask,
            )?,
        }
        Ok(())
    }
}
