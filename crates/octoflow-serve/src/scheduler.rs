//! The scheduler thread: continuous batching over a [`BatchForward`] engine.
//!
//! Each instance (engine slot) holds at most one sequence (one choice of one request) or one
//! instance of an agent run. Every iteration:
//! 1. sequences and agent runs whose client went away are dropped (their instances are free
//!    for the next step);
//! 2. waiting work is admitted while enough instances are free (`n` choices need `n`, an agent
//!    run its `instances`);
//! 3. while fewer than [`MAX_IN_FLIGHT`] steps are in flight, a step is built and submitted:
//!    one decode row for every sequence that has its next input (up to `max_rows`, rotating
//!    which go first), then prompt chunks of the sequences still prefilling, and the rows of
//!    the agent runs whose previous rows are back ([`crate::agents::active`]); see
//!    [`Loop::submit_step`] for how the room is shared;
//! 4. the oldest step in flight is collected and its tokens handed to their sequences, and
//!    each agent run in it takes its slice of the results.
//!
//! Pipelining: a sequence sampled on the device takes its next input as
//! [`TokenIn::Sampled`] when its sampling row is in the step just submitted, so step N+1 goes to
//! the engine before step N's tokens are read. Its tokens are thus read one step late: a
//! sequence that ends (end-of-generation, stop string) has usually already been given one more
//! row, whose result is dropped; it wastes at most one step's row. Sequences sampled on the CPU
//! (penalties, log-probabilities, parameters the device sampler lacks) get their logits back
//! and take part in every other step at most. Sequences under a grammar stay pipelined too
//! where the engine takes late masks ([`BatchForward::submit_late`]): the mask of their next
//! token exists only once the previous token is known, so step N + 1 goes to the engine with
//! their draws held, and once step N is collected their masks are computed on the host's cores
//! in parallel and given while step N + 1's forward pass runs. Elsewhere they wait for their
//! token and take part in every other step.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use octoflow_core::TokenMask;
use octoflow_model::{BatchForward, BatchRow, RowOutput, RowResult, TokenIn, MAX_IN_FLIGHT};
use octoflow_text::Tokenizer;
use tokio::sync::oneshot;

use crate::agents::active::{ActiveRun, Outcome as RunOutcome, Part, Planned};
use crate::job::{Queue, Work};
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
    /// Place requests where an instance's cache already holds the start of their prompt
    /// ([`crate::prefix`]).
    pub prefix_cache: bool,
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

/// A submitted step: which rows give which sequence a token, and which rows are agent runs'.
struct StepMeta {
    rows: Vec<RowMeta>,
    /// Kept apart from `rows`: an agent run's device-sampled row is never a sequence's
    /// [`TokenIn::Sampled`] input.
    agents: Vec<Planned>,
    n_rows: usize,
    submitted: Instant,
    /// Its late rows' masks are still to be given (once the step before it is collected).
    owes: bool,
}

struct RowMeta {
    /// Index of the row in the step.
    row: usize,
    slot: usize,
    seq: u64,
    /// A later row already took this row's token as [`TokenIn::Sampled`].
    consumed: bool,
    /// The grammar gave no mask for this row's draw (the sequence fails when it returns).
    mask_error: Option<String>,
    /// Its draw's mask is given after the submit (it takes the previous step's token on the
    /// device, so its grammar has not seen that token yet).
    late: bool,
}

impl Driver {
    /// Hands the device's sensor and pacer to the loop (before [`Driver::run`]): the loop paces
    /// its submits with it, `/metrics` exports its readings, the banner names its targets.
    pub fn set_pacer(&self, pacer: octoflow_homeo::Pacer) {
        let _ = self.metrics.pacer.set(pacer);
    }

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
        self.queue.set_idle(ready.n_slots);
        if let Some(tx) = self.ready.take() {
            // The server may have given up waiting; serving on is harmless.
            let _ = tx.send(ready);
        }
        let tokenizer = self.tokenizer.clone();
        let metrics = self.metrics.clone();
        let engine_slots = engine.n_slots();
        let pacer = metrics.pacer.get().cloned().unwrap_or_default();
        let mut s = Loop {
            engine,
            slots: Vec::new(),
            runs: Vec::new(),
            inflight: VecDeque::new(),
            next_id: 0,
            rotate: 0,
            opts: self.opts.clone(),
            queue: self.queue.clone(),
            metrics: &metrics,
            tokenizer: &tokenizer,
            last_collect: Instant::now(),
            engine_held: vec![false; engine_slots],
            used: vec![0; engine_slots],
            clock: 0,
            pacer,
        };
        s.slots = (0..s.engine.n_slots()).map(|_| None).collect();
        s.serve();
        Ok(())
    }
}

#[path = "grammar_masks.rs"]
mod grammar_masks;

struct Loop<'a, 't> {
    engine: &'a mut dyn BatchForward,
    slots: Vec<Option<Seq<'t>>>,
    /// Admitted agent runs; the slots they hold are `None` in `slots`.
    runs: Vec<ActiveRun>,
    inflight: VecDeque<StepMeta>,
    next_id: u64,
    rotate: usize,
    opts: SchedOptions,
    queue: Arc<Queue>,
    metrics: &'t Metrics,
    tokenizer: &'t Tokenizer,
    last_collect: Instant,
    /// Per instance: whether the engine holds KV memory for it (a sequence or a run was
    /// given it and the engine was not told that it ended).
    engine_held: Vec<bool>,
    /// Per instance: when it was last given out (higher: more recent).
    used: Vec<u64>,
    clock: u64,
    /// Holds the temperature/power targets: delays a submit after busy time (a no-op without
    /// a target).
    pacer: octoflow_homeo::Pacer,
}

impl<'t> Loop<'_, 't> {
    /// Ends the sequence in `slot`: what its cache now holds is left to the engine's prefix
    /// cache (when on) and its memory released.
    fn release(&mut self, slot: usize) {
        if let Some(seq) = self.slots.get_mut(slot).and_then(Option::take) {
            if self.opts.prefix_cache {
                self.engine.hold(slot as u32, &seq.written(), seq.adapter);
            }
            self.engine.release(slot as u32);
            if let Some(h) = self.engine_held.get_mut(slot) {
                *h = false;
            }
            // before the choice's end goes out (when `seq` drops, below): a client that got
            // it may ask again at once, and an idle server must not refuse it
            self.queue.set_idle(self.free_slots().len());
        }
    }

    /// Releases the engine's memory of instances that nothing holds any more (ended agent
    /// runs, failed sequences), so that the pool serves the waiting work.
    fn sweep(&mut self) {
        let mut taken: Vec<bool> = self.slots.iter().map(Option::is_some).collect();
        for r in &self.runs {
            for &s in &r.slots {
                if let Some(t) = taken.get_mut(s) {
                    *t = true;
                }
            }
        }
        for (s, held) in self.engine_held.iter_mut().enumerate() {
            if *held && !taken.get(s).copied().unwrap_or(false) {
                self.engine.release(s as u32);
                *held = false;
            }
        }
    }

    /// KV positions `work` needs beyond what it would reuse, and whether the engine could
    /// ever give them (`None`: it fits no matter what, the engine has no shared pool).
    fn kv_need(&self, work: &Work, free: &[usize]) -> Option<(usize, bool)> {
        let room = self.engine.kv_room()?;
        let n_ctx = self.engine.n_ctx();
        let whole =
            |p: usize| p.div_ceil(octoflow_model::kv_pool::PAGE) * octoflow_model::kv_pool::PAGE;
        let need = match work {
            Work::Generate(j) => {
                let positions = whole((j.prompt.len() + j.params.max_tokens).min(n_ctx));
                let reuse = free
                    .first()
                    .map_or(0, |&s| self.engine.reusable(s as u32, &j.prompt, j.adapter));
                positions.saturating_sub(reuse) * j.params.n
            }
            Work::Agents(a) => whole(n_ctx) * a.config.instances,
        };
        Some((need, need <= room.total))
    }

    /// Free instances for a request with `prompt`, as many as `n`: the ones whose reusable
    /// start of it is longest first, then the least recently used (so recent prefixes stay
    /// for the requests that may share them).
    fn pick(&self, free: &[usize], n: usize, prompt: &[u32], adapter: Option<u32>) -> Vec<usize> {
        let mut order: Vec<(usize, usize)> = free
            .iter()
            .map(|&s| (s, self.engine.reusable(s as u32, prompt, adapter)))
            .collect();
        order.sort_by_key(|&(s, reuse)| (std::cmp::Reverse(reuse), self.used[s], s));
        order.into_iter().take(n).map(|(s, _)| s).collect()
    }

    /// Marks `slot` given out.
    fn give(&mut self, slot: usize) {
        self.clock += 1;
        self.used[slot] = self.clock;
        self.engine_held[slot] = true;
    }

    fn serve(&mut self) {
        let mut deadline: Option<Instant> = None;
        loop {
            self.drop_disconnected();
            if self.queue.is_closed() {
                let d = *deadline.get_or_insert_with(|| Instant::now() + self.opts.grace);
                for work in self.queue.drain() {
                    work.refuse("the server is shutting down");
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
            if let Some(room) = self.engine.kv_room() {
                let m = self.metrics;
                let set = |g: &std::sync::atomic::AtomicU64, v: usize| {
                    g.store(v as u64, std::sync::atomic::Ordering::Relaxed);
                };
                set(&m.kv_total, room.total);
                set(&m.kv_available, room.available);
                set(&m.kv_cached, room.cached);
            }
            let (mut submitted, mut progressed) = (false, false);
            if self.engine.pending() < MAX_IN_FLIGHT {
                (submitted, progressed) = self.submit_step();
            }
            let pending = self.engine.pending();
            if pending > 0 && (pending >= MAX_IN_FLIGHT || !submitted) {
                self.collect_step();
            } else if pending == 0 && !submitted && !progressed {
                // Nothing to run: wait for work (or, with sequences that cannot move, which
                // should not happen, avoid spinning). The wait is not busy time to pace.
                self.pacer.mark_idle();
                self.queue
                    .wait(Duration::from_millis(if self.active() == 0 {
                        100
                    } else {
                        5
                    }));
            }
        }
    }

    /// Instances in use: by sequences and by agent runs.
    fn active(&self) -> usize {
        let seqs = self.slots.iter().filter(|s| s.is_some()).count();
        seqs + self.runs.iter().map(|r| r.slots.len()).sum::<usize>()
    }

    /// Slots that neither a sequence nor an agent run holds, in order.
    fn free_slots(&self) -> Vec<usize> {
        let mut free: Vec<bool> = self.slots.iter().map(Option::is_none).collect();
        for r in &self.runs {
            for &s in &r.slots {
                free[s] = false;
            }
        }
        (0..free.len()).filter(|&s| free[s]).collect()
    }

    fn drop_disconnected(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].as_ref().is_some_and(|s| s.disconnected()) {
                self.release(slot);
                Metrics::inc(&self.metrics.requests_cancelled);
            }
        }
        // A cancelled run's rows still in flight are dropped when collected (by its id).
        let before = self.runs.len();
        self.runs.retain(|r| !r.disconnected());
        for _ in self.runs.len()..before {
            Metrics::inc(&self.metrics.requests_cancelled);
        }
    }

    fn fail_all(&mut self, message: &str) {
        for s in 0..self.engine_held.len() {
            // the caches may hold anything now: nothing of them is reused
            self.engine.release(s as u32);
            self.engine_held[s] = false;
        }
        for slot in &mut self.slots {
            if let Some(seq) = slot.take() {
                seq.fail(message);
            }
        }
        for run in self.runs.drain(..) {
            run.fail(message, "server_error");
        }
    }

    /// Collects what is still in flight (results dropped), so the engine is idle.
    fn drain_inflight(&mut self) {
        for _ in 0..self.engine.pending() {
            if let Err(e) = self.engine.collect() {
                tracing::error!("collecting a step that is dropped: {e}");
            }
        }
        self.inflight.clear();
    }

    /// Admits waiting work while it fits in the free instances and the KV memory (work that
    /// could never fit the KV pool is refused with the reason).
    fn admit(&mut self) {
        self.sweep();
        loop {
            let free = self.free_slots();
            let available = self.engine.kv_room().map_or(usize::MAX, |r| r.available);
            let Some(work) = self.queue.pop_if(|w| {
                let kv = self.kv_need(w, &free);
                let kv_ok = kv.is_none_or(|(need, _)| need <= available);
                let never = kv.is_some_and(|(_, ever)| !ever);
                (w.instances() <= free.len() && kv_ok) || never || w.abandoned()
            }) else {
                self.queue.set_idle(free.len());
                return;
            };
            if work.abandoned() {
                Metrics::inc(&self.metrics.requests_cancelled);
                continue;
            }
            if let Some((need, false)) = self.kv_need(&work, &free) {
                let total = self.engine.kv_room().map_or(0, |r| r.total);
                work.refuse(&format!(
                    "the request needs {need} KV cache positions (prompt and max_tokens for \
                     each choice) and the server's KV cache holds {total}: shorten it or \
                     start the server with a larger --kv-size"
                ));
                continue;
            }
            let job = match work {
                Work::Generate(job) => job,
                Work::Agents(job) => {
                    let slots: Vec<usize> =
                        free.iter().take(job.config.instances).copied().collect();
                    // the run's programs write these caches as they please: nothing reused,
                    // each instance promised a whole context
                    let n_ctx = self.engine.n_ctx();
                    for &s in &slots {
                        self.engine.release(s as u32);
                        self.give(s);
                        if let Err(e) = self.engine.reserve(s as u32, n_ctx) {
                            tracing::warn!("agent run instance {s}: {e}");
                        }
                    }
                    let chunk = self.opts.prefill_chunk;
                    // The host tasks once each (how often a program feeds them is its own).
                    let prompt: usize = job.tasks.iter().map(Vec::len).sum();
                    self.metrics
                        .prompt_tokens
                        .fetch_add(prompt as u64, std::sync::atomic::Ordering::Relaxed);
                    // A run that cannot start was refused through its channel; the handler
                    // answers it and counts the failure.
                    if let Ok(run) =
                        ActiveRun::start(self.next_id, job, slots, &*self.engine, chunk)
                    {
                        self.runs.push(run);
                    }
                    self.next_id += 1;
                    continue;
                }
            };
            self.metrics.prompt_tokens.fetch_add(
                (job.prompt.len() * job.params.n) as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            let picked = self.pick(&free, job.params.n, &job.prompt, job.adapter);
            let positions = (job.prompt.len() + job.params.max_tokens).min(self.engine.n_ctx());
            let mut reused = Vec::with_capacity(picked.len());
            let mut short = None;
            for &slot in &picked {
                reused.push(self.engine.reuse(slot as u32, &job.prompt, job.adapter));
                self.give(slot);
                if let Err(e) = self.engine.reserve(slot as u32, positions) {
                    short = Some(e);
                }
            }
            if let Some(e) = short {
                // the admission check counted on more than the pool gave (a prefix it meant
                // to share was evicted meanwhile): refused, nothing runs
                for &slot in &picked {
                    self.engine.release(slot as u32);
                    self.engine_held[slot] = false;
                }
                Work::Generate(job).refuse(&format!("{e}; try again"));
                continue;
            }
            for (index, (&slot, &reuse)) in picked.iter().zip(&reused).enumerate() {
                let mut seq = Seq::new(
                    self.next_id,
                    index,
                    &job,
                    &*self.engine,
                    self.tokenizer,
                    self.metrics,
                );
                seq.reuse_prompt(reuse);
                self.metrics.prefix_lookup(reuse);
                self.slots[slot] = Some(seq);
                self.next_id += 1;
            }
        }
    }

    /// Builds and submits one step. Returns whether rows were submitted, and whether anything
    /// moved at all (an agent run may end a step without rows: an interpret-only step).
    ///
    /// The room is shared so that neither kind of work starves the other: decode rows of the
    /// sequences go first (one each; one row is kept back when an agent run is ready, so a
    /// step full of decode rows cannot hold a run off for ever); of the rows left, prompt
    /// chunks may take half, the ready agent runs (rotating which goes first) then plan into
    /// what remains, and prompt chunks take whatever the runs left.
    fn submit_step(&mut self) -> (bool, bool) {
        let max_rows = self.engine.max_rows();
        let mut rows: Vec<BatchRow> = Vec::new();
        let mut meta: Vec<RowMeta> = Vec::new();
        self.rotate = (self.rotate + 1) % self.slots.len();
        let ready = self.runs.iter().any(|r| !r.in_flight);
        self.decode_rows(&mut rows, &mut meta, decode_cap(max_rows, ready));
        let cap = prefill_first_cap(max_rows, rows.len(), ready);
        self.prefill_rows(&mut rows, &mut meta, cap);
        let (agents, progressed) = self.agent_rows(&mut rows, max_rows);
        self.prefill_rows(&mut rows, &mut meta, max_rows);
        if rows.is_empty() {
            return (false, progressed);
        }
        self.pacer.before_submit();
        let submitted = Instant::now();
        let sampling: Vec<bool> = rows
            .iter()
            .map(|r| matches!(r.output, RowOutput::Sample(_)))
            .collect();
        let masks = self.masks(rows.len(), &mut meta, |m| !m.late && sampling[m.row]);
        let mask_refs: Vec<Option<&TokenMask>> = masks.iter().map(Option::as_ref).collect();
        let mut late = vec![false; rows.len()];
        for m in meta.iter().filter(|m| m.late) {
            late[m.row] = true;
        }
        let owes = late.contains(&true);
        let sent = if owes {
            self.engine.submit_late(&rows, &mask_refs, &late)
        } else {
            self.engine.submit_masked(&rows, &mask_refs)
        };
        match sent {
            Ok(()) => {
                self.inflight.push_back(StepMeta {
                    rows: meta,
                    agents,
                    n_rows: rows.len(),
                    submitted,
                    owes,
                });
                (true, true)
            }
            Err(e) => {
                self.engine_failed(&format!("submitting a step: {e}"));
                (false, true)
            }
        }
    }

    /// One decode row for every sequence that has its next input, up to `cap` rows in the
    /// step, rotating which sequences go first.
    fn decode_rows(&mut self, rows: &mut Vec<BatchRow>, meta: &mut Vec<RowMeta>, cap: usize) {
        let n_ctx = self.engine.n_ctx();
        let late_masks = self.engine.late_masks();
        let n = self.slots.len();
        for k in 0..n {
            if rows.len() >= cap {
                break;
            }
            let slot = (self.rotate + k) % n;
            let Some(seq) = self.slots[slot].as_mut() else {
                continue;
            };
            if !seq.prefilled() || seq.requested >= seq.max_tokens || seq.next_pos >= n_ctx {
                continue;
            }
            let mut late = false;
            let token = if let Some(t) = seq.pending.take() {
                TokenIn::Id(t)
            } else if let Some(prev) = self.inflight.back_mut().and_then(|step| {
                step.rows
                    .iter_mut()
                    .find(|r| r.seq == seq.id && !r.consumed)
            }) {
                late = seq.constrained();
                if !seq.device || (late && !late_masks) {
                    // the CPU draws it, or its mask needs the token first: wait for it
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
                mask_error: None,
                late: late && matches!(output, RowOutput::Sample(_)),
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
    }

    /// Prompt chunks of the sequences still prefilling, until the step holds `cap` rows (at
    /// most `prefill_chunk` per sequence per call; a second call goes on where the first
    /// stopped). The rows are shared ([`share_rows`]), so a short prompt is not held behind a
    /// long one that arrived first.
    fn prefill_rows(&mut self, rows: &mut Vec<BatchRow>, meta: &mut Vec<RowMeta>, cap: usize) {
        let room = cap.saturating_sub(rows.len());
        // oldest first: where rows are too few for everyone, the earliest requests get them
        let mut waiting: Vec<(u64, usize, usize)> = (self.slots.iter().enumerate())
            .filter_map(|(slot, s)| s.as_ref().map(|s| (slot, s)))
            .filter(|(_, s)| !s.prefilled())
            .map(|(slot, s)| {
                let want = (s.prompt.len() - s.fed).min(self.opts.prefill_chunk.max(1));
                (s.id, slot, want)
            })
            .collect();
        waiting.sort_unstable();
        let wants: Vec<(usize, usize)> = waiting.iter().map(|&(_, slot, w)| (slot, w)).collect();
        let takes = share_rows(&wants, room);
        for (slot, take) in takes {
            let Some(seq) = self.slots[slot].as_mut() else {
                continue;
            };
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
                        mask_error: None,
                        late: false,
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
    }

    /// The parts of the agent runs whose previous rows are back, until the step holds `cap`
    /// rows; runs that ended without rows are removed. Returns the runs' rows and whether a
    /// run moved.
    fn agent_rows(&mut self, rows: &mut Vec<BatchRow>, cap: usize) -> (Vec<Planned>, bool) {
        let mut planned = Vec::new();
        let mut progressed = false;
        let n = self.runs.len();
        let first = if n == 0 { 0 } else { self.rotate % n };
        let mut ended = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let room = cap.saturating_sub(rows.len());
            let metrics = self.metrics;
            let run = &mut self.runs[i];
            if room == 0 || run.in_flight {
                continue;
            }
            let before = run.generated();
            match run.plan(room, rows, self.tokenizer) {
                Part::Rows(p) => planned.push(p),
                Part::Interpreted(outcome) => {
                    progressed = true;
                    count_generated(metrics, run.generated() - before);
                    if outcome != RunOutcome::Continue {
                        ended.push((i, outcome));
                    }
                }
            }
        }
        ended.sort_unstable_by_key(|&(i, _)| std::cmp::Reverse(i));
        for (i, outcome) in ended {
            self.runs.remove(i);
            self.count_end(outcome);
        }
        (planned, progressed)
    }

    fn count_end(&self, outcome: RunOutcome) {
        match outcome {
            RunOutcome::Done => Metrics::inc(&self.metrics.requests_ok),
            RunOutcome::Failed => Metrics::inc(&self.metrics.requests_failed),
            RunOutcome::Continue => {}
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
            if let Some(e) = &rm.mask_error {
                seq.fail(e);
                self.release(rm.slot);
                continue;
            }
            let (token, logprob) = match results.get(rm.row) {
                Some(RowResult::Token { token, .. }) => {
                    if let Err(e) = seq.commit(*token) {
                        seq.fail(&e.to_string());
                        self.release(rm.slot);
                        continue;
                    }
                    (*token, None)
                }
                Some(RowResult::Logits(l)) => match seq.sample_logits(l) {
                    Ok(t) => t,
                    Err(e) => {
                        seq.fail(&e.to_string());
                        self.release(rm.slot);
                        continue;
                    }
                },
                _ => {
                    seq.fail("the engine returned no token for a sampling row");
                    self.slots[rm.slot] = None; // released by the next sweep, not reused
                    continue;
                }
            };
            if !rm.consumed {
                seq.pending = Some(token);
            }
            if seq.push(token, logprob) == Outcome::Finished {
                self.release(rm.slot);
            }
        }
        self.give_late_masks();
        for planned in meta.agents {
            // A run cancelled since is gone: its results are dropped.
            let Some(i) = self.runs.iter().position(|r| r.id == planned.run) else {
                continue;
            };
            let metrics = self.metrics;
            let run = &mut self.runs[i];
            let before = run.generated();
            let outcome = run.take(&planned, &results, self.tokenizer);
            count_generated(metrics, run.generated() - before);
            if outcome != RunOutcome::Continue {
                self.runs.remove(i);
                self.count_end(outcome);
            }
        }
    }
}

/// Counts an agent run's generated tokens with the sequences'.
fn count_generated(metrics: &Metrics, tokens: u64) {
    metrics
        .generation_tokens
        .fetch_add(tokens, std::sync::atomic::Ordering::Relaxed);
}

/// Most rows the sequences' decode rows may fill: all of them, but one when an agent run is
/// ready to plan (so decode rows alone never hold a run off).
fn decode_cap(max_rows: usize, agents_ready: bool) -> usize {
    if agents_ready && max_rows > 1 {
        max_rows - 1
    } else {
        max_rows
    }
}

/// Rows the step may hold after the sequences' first prompt chunks, when the step already
/// holds `rows`: with an agent run ready, the chunks take at most half of what is left (the
/// smaller half, so the row decode rows left is the runs'), and the runs plan next; else
/// everything.
fn prefill_first_cap(max_rows: usize, rows: usize, agents_ready: bool) -> usize {
    if agents_ready {
        rows + max_rows.saturating_sub(rows) / 2
    } else {
        max_rows
    }
}

/// Splits `room` prompt rows over sequences wanting `wants[i].1` rows each (in priority order):
/// the smaller wants are met whole and the rest share what is left evenly (water-filling),
/// the earlier ones taking the remainder's odd rows. Returns `(slot, rows)` for every sequence
/// that gets rows, in the order given.
fn share_rows(wants: &[(usize, usize)], room: usize) -> Vec<(usize, usize)> {
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by_key(|&i| (wants[i].1, i));
    let mut takes = vec![0usize; wants.len()];
    let mut left = room;
    for (k, &i) in order.iter().enumerate() {
        let sharing = wants.len() - k;
        let even = left / sharing;
        if wants[i].1 <= even {
            takes[i] = wants[i].1;
            left -= wants[i].1;
            continue;
        }
        // every want from here on is larger than the even share: all take it, and the odd
        // rows go to the earliest in priority order
        let mut rest: Vec<usize> = order[k..].to_vec();
        rest.sort_unstable();
        let odd = left - even * sharing;
        for (n, &j) in rest.iter().enumerate() {
            takes[j] = even + usize::from(n < odd);
        }
        break;
    }
    (wants.iter().zip(takes))
        .filter(|&(_, t)| t > 0)
        .map(|(&(slot, _), t)| (slot, t))
        .collect()
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
