//! The scheduler thread: continuous batching over a [`BatchForward`] engine.
//!
//! Each instance (engine slot) holds at most one sequence (one choice of one request). Every
//! iteration:
//! 1. sequences whose client went away are dropped (their instance is free for the next step);
//! 2. waiting jobs are admitted while enough instances are free (`n` choices need `n`);
//! 3. while fewer than [`MAX_IN_FLIGHT`] steps are in flight, a step is built and submitted:
//!    one decode row for every sequence that has its next input (up to `max_rows`, rotating
//!    which go first), then prompt chunks of the sequences still prefilling in the rows left
//!    (at most `prefill_chunk` per sequence per step);
//! 4. the oldest step in flight is collected and its tokens handed to their sequences.
//!
//! Pipelining: a sequence sampled on the device takes its next input as
//! [`TokenIn::Sampled`] when its sampling row is in the step just submitted, so step N+1 goes to
//! the engine before step N's tokens are read. Its tokens are thus read one step late: a
//! sequence that ends (end-of-generation, stop string) has usually already been given one more
//! row, whose result is dropped; it wastes at most one step's row. Sequences sampled on the CPU
//! (penalties, log-probabilities, parameters the device sampler lacks) get their logits back
//! and take part in every other step at most.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use octoflow_model::{BatchForward, BatchRow, RowOutput, RowResult, TokenIn, MAX_IN_FLIGHT};
use octoflow_text::Tokenizer;
use tokio::sync::oneshot;

use crate::job::{Event, Queue};
use crate::metrics::Metrics;
use crate::seq::{Outcome, Seq};

/// What the engine reports for the startup banner.
#[derive(Debug, Clone, Default)]
pub struct EngineInfo {
    /// The device, in words.
    pub device: String,
    /// Device memory (bytes) in use and in all, where known.
    pub memory: Option<(u64, u64)>,
}

/// The engine's shape, sent once it is built.
#[derive(Debug, Clone)]
pub struct Ready {
    /// Instances (engine slots).
    pub n_slots: usize,
    /// Positions per instance.
    pub n_ctx: usize,
    /// Most rows per step.
    pub max_rows: usize,
    /// For the banner.
    pub info: EngineInfo,
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct SchedOptions {
    /// Most prompt rows of one sequence per step.
    pub prefill_chunk: usize,
    /// After shutdown begins, how long in-flight requests may still run before they are
    /// cancelled.
    pub grace: Duration,
}

/// Handed to the engine factory: it builds the engine (which may borrow what the factory owns)
/// and calls [`Driver::run`], which serves until shutdown.
pub struct Driver {
    pub(crate) queue: Arc<Queue>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) tokenizer: Arc<Tokenizer>,
    pub(crate) ready: Option<oneshot::Sender<Ready>>,
    pub(crate) opts: SchedOptions,
}

/// A submitted step: which rows give which sequence a token.
struct StepMeta {
    rows: Vec<RowMeta>,
    n_rows: usize,
    submitted: Instant,
}

struct RowMeta {
    /// Index of the row in the step.
    row: usize,
    slot: usize,
    seq: u64,
    /// A later row already took this row's token as [`TokenIn::Sampled`].
    consumed: bool,
}

impl Driver {
    /// Runs the continuous-batching loop on `engine` until the queue is closed and every
    /// sequence has ended (or was cancelled after the grace period).
    pub fn run(mut self, engine: &mut dyn BatchForward, info: EngineInfo) -> anyhow::Result<()> {
        let ready = Ready {
            n_slots: engine.n_slots(),
            n_ctx: engine.n_ctx(),
            max_rows: engine.max_rows(),
            info,
        };
        if ready.n_slots == 0 || ready.max_rows == 0 {
            anyhow::bail!("the engine has no instance or no row per step");
        }
        self.metrics
            .instances
            .store(ready.n_slots as u64, std::sync::atomic::Ordering::Relaxed);
        if let Some(tx) = self.ready.take() {
            // The server may have given up waiting; serving on is harmless.
            let _ = tx.send(ready);
        }
        let tokenizer = self.tokenizer.clone();
        let metrics = self.metrics.clone();
        let mut s = Loop {
            engine,
            slots: Vec::new(),
            inflight: VecDeque::new(),
            next_id: 0,
            rotate: 0,
            opts: self.opts.clone(),
            queue: self.queue.clone(),
            metrics: &metrics,
            tokenizer: &tokenizer,
            last_collect: Instant::now(),
        };
        s.slots = (0..s.engine.n_slots()).map(|_| None).collect();
        s.serve();
        Ok(())
    }
}

struct Loop<'a, 't> {
    engine: &'a mut dyn BatchForward,
    slots: Vec<Option<Seq<'t>>>,
    inflight: VecDeque<StepMeta>,
    next_id: u64,
    rotate: usize,
    opts: SchedOptions,
    queue: Arc<Queue>,
    metrics: &'t Metrics,
    tokenizer: &'t Tokenizer,
    last_collect: Instant,
}

impl<'t> Loop<'_, 't> {
    fn serve(&mut self) {
        let mut deadline: Option<Instant> = None;
        loop {
            self.drop_disconnected();
            if self.queue.is_closed() {
                let d = *deadline.get_or_insert_with(|| Instant::now() + self.opts.grace);
                for job in self.queue.drain() {
                    let _ = job.events.send(Event::Error {
                        message: "the server is shutting down".into(),
                    });
                }
                if Instant::now() >= d {
                    self.fail_all("the server shut down before the request finished");
                }
                if self.active() == 0 {
                    self.drain_inflight();
                    return;
                }
            } else {
                self.admit();
            }
            self.metrics
                .active_instances
                .store(self.active() as u64, std::sync::atomic::Ordering::Relaxed);
            let mut submitted = false;
            if self.engine.pending() < MAX_IN_FLIGHT {
                submitted = self.submit_step();
            }
            let pending = self.engine.pending();
            if pending > 0 && (pending >= MAX_IN_FLIGHT || !submitted) {
                self.collect_step();
            } else if pending == 0 && !submitted {
                // Nothing to run: wait for work (or, with sequences that cannot move, which
                // should not happen, avoid spinning).
                self.queue
                    .wait(Duration::from_millis(if self.active() == 0 {
                        100
                    } else {
                        5
                    }));
            }
        }
    }

    fn active(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    fn drop_disconnected(&mut self) {
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(|s| s.disconnected()) {
                *slot = None;
                Metrics::inc(&self.metrics.requests_cancelled);
            }
        }
    }

    fn fail_all(&mut self, message: &str) {
        for slot in &mut self.slots {
            if let Some(seq) = slot.take() {
                seq.fail(message);
            }
        }
    }

    /// Collects what is still in flight (results dropped), so the engine is idle.
    fn drain_inflight(&mut self) {
        while self.engine.pending() > 0 {
            if let Err(e) = self.engine.collect() {
                tracing::error!("collecting a step at shutdown: {e}");
                break;
            }
        }
        self.inflight.clear();
    }

    /// Admits waiting jobs while their choices fit in the free instances.
    fn admit(&mut self) {
        loop {
            let free = self.slots.iter().filter(|s| s.is_none()).count();
            let Some(job) = self
                .queue
                .pop_if(|j| j.params.n <= free || j.events.is_closed())
            else {
                return;
            };
            if job.events.is_closed() {
                Metrics::inc(&self.metrics.requests_cancelled);
                continue;
            }
            self.metrics.prompt_tokens.fetch_add(
                (job.prompt.len() * job.params.n) as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            let free_slots = self.slots.iter_mut().filter(|s| s.is_none());
            for (index, slot) in free_slots.take(job.params.n).enumerate() {
                *slot = Some(Seq::new(
                    self.next_id,
                    index,
                    &job,
                    &*self.engine,
                    self.tokenizer,
                    self.metrics,
                ));
                self.next_id += 1;
            }
        }
    }

    /// Builds and submits one step; false when no sequence has a row to run.
    fn submit_step(&mut self) -> bool {
        let max_rows = self.engine.max_rows();
        let n_ctx = self.engine.n_ctx();
        let mut rows: Vec<BatchRow> = Vec::new();
        let mut meta: Vec<RowMeta> = Vec::new();
        let n = self.slots.len();
        self.rotate = (self.rotate + 1) % n;
        // Decode rows first, rotating which sequences go first when they do not all fit.
        for k in 0..n {
            if rows.len() >= max_rows {
                break;
            }
            let slot = (self.rotate + k) % n;
            let Some(seq) = self.slots[slot].as_mut() else {
                continue;
            };
            if !seq.prefilled() || seq.requested >= seq.max_tokens || seq.next_pos >= n_ctx {
                continue;
            }
            let token = if let Some(t) = seq.pending.take() {
                TokenIn::Id(t)
            } else if let Some(prev) = self.inflight.back_mut().and_then(|step| {
                step.rows
                    .iter_mut()
                    .find(|r| r.seq == seq.id && !r.consumed)
            }) {
                if !seq.device {
                    continue;
                }
                prev.consumed = true;
                TokenIn::Sampled
            } else {
                continue;
            };
            let output = seq.next_draw().map_or(RowOutput::Logits, RowOutput::Sample);
            meta.push(RowMeta {
                row: rows.len(),
                slot,
                seq: seq.id,
                consumed: false,
            });
            rows.push(BatchRow {
                slot: slot as u32,
                pos: seq.next_pos as u32,
                token,
                output,
                adapter: seq.adapter,
            });
            seq.next_pos += 1;
            seq.requested += 1;
        }
        // Prompt chunks in the rows left.
        for slot in 0..n {
            let room = max_rows.saturating_sub(rows.len());
            if room == 0 {
                break;
            }
            let Some(seq) = self.slots[slot].as_mut() else {
                continue;
            };
            if seq.prefilled() {
                continue;
            }
            let take = room
                .min(self.opts.prefill_chunk.max(1))
                .min(seq.prompt.len() - seq.fed);
            for k in 0..take {
                let i = seq.fed + k;
                let last = i + 1 == seq.prompt.len();
                let output = if !last {
                    RowOutput::None
                } else {
                    meta.push(RowMeta {
                        row: rows.len(),
                        slot,
                        seq: seq.id,
                        consumed: false,
                    });
                    seq.requested += 1;
                    seq.next_draw().map_or(RowOutput::Logits, RowOutput::Sample)
                };
                rows.push(BatchRow {
                    slot: slot as u32,
                    pos: i as u32,
                    token: TokenIn::Id(seq.prompt[i]),
                    output,
                    adapter: seq.adapter,
                });
            }
            seq.fed += take;
            seq.next_pos = seq.fed;
        }
        if rows.is_empty() {
            return false;
        }
        let submitted = Instant::now();
        match self.engine.submit(&rows) {
            Ok(()) => {
                self.inflight.push_back(StepMeta {
                    rows: meta,
                    n_rows: rows.len(),
                    submitted,
                });
                true
            }
            Err(e) => {
                self.engine_failed(&format!("submitting a step: {e}"));
                false
            }
        }
    }

    /// The engine failed: every sequence ends with the error, in-flight steps are dropped.
    fn engine_failed(&mut self, message: &str) {
        tracing::error!("{message}");
        self.fail_all(&format!("the engine failed: {message}"));
        self.drain_inflight();
    }

    /// Collects the oldest step and hands its tokens to their sequences.
    fn collect_step(&mut self) {
        let results = match self.engine.collect() {
            Ok(r) => r,
            Err(e) => {
                self.engine_failed(&format!("collecting a step: {e}"));
                return;
            }
        };
        let Some(meta) = self.inflight.pop_front() else {
            return;
        };
        let now = Instant::now();
        self.metrics
            .step(meta.n_rows, now - meta.submitted.max(self.last_collect));
        self.last_collect = now;
        for rm in meta.rows {
            let Some(seq) = self.slots[rm.slot].as_mut().filter(|s| s.id == rm.seq) else {
                continue;
            };
            let (token, logprob) = match results.get(rm.row) {
                Some(RowResult::Token { token, .. }) => (*token, None),
                Some(RowResult::Logits(l)) => seq.sample_logits(l),
                _ => {
                    seq.fail("the engine returned no token for a sampling row");
                    self.slots[rm.slot] = None;
                    continue;
                }
            };
            if !rm.consumed {
                seq.pending = Some(token);
            }
            if seq.push(token, logprob) == Outcome::Finished {
                self.slots[rm.slot] = None;
            }
        }
    }
}
