//! One instance's state, and how a token enters its context and its span.
//!
//! The context is the instance's KV slot (positions `0..pos`) plus at most one *pending* token
//! (the last generated one, in the context but not yet run through the model), so
//! `%pos = pos + pending` and `%pos <= n_ctx` always: a span stops with finish `length`
//! (`Finish::Context`) once the pending token fills the last position.

use octoflow_core::Finish;

use crate::isa::{NO_STOP, NO_TASK, N_REGS};
use crate::memory::{Arena, Span};

/// What an instance is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Executing instructions in the next interpret phase.
    Run,
    /// At a `wait` or `take` that could not proceed; tried again every step.
    Wait,
    /// Feeding an `append`'s tokens.
    Feed,
    /// Generating a `gen` span.
    Gen,
    /// Done.
    Halted,
    /// Stopped by a runtime error.
    Error,
}

impl Status {
    /// Whether the instance still takes part in the run.
    pub fn is_live(self) -> bool {
        !matches!(self, Status::Halted | Status::Error)
    }
}

/// What a `Wait` instance waits for (for a deadlock report); names are indices into the
/// program's tables so the GPU can record it in words.
///
/// The numbers are those the instance saw, as visible at its step: a deadlock is reported only
/// after a step in which nothing changed, so they are the queue's and mailbox's final counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Waiting {
    /// Not waiting yet.
    #[default]
    Nothing,
    /// `wait`: mailbox `mailbox` holds `have` of the `count` messages asked for.
    Mailbox { mailbox: u32, have: u32, count: u32 },
    /// `take`: queue `queue` is open and empty, `pushed` tasks visible and `taken` taken.
    Queue { queue: u32, pushed: u32, taken: u32 },
}

/// The token sampled from an append's last row, kept for a `gen` that follows at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Presample {
    pub token: u32,
    pub logprob: f32,
}

/// What an `append` feeds: the pending token (if there was one), then arena tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Feed {
    pub first: Option<u32>,
    pub offset: u32,
    pub len: u32,
    /// Tokens fed so far.
    pub cursor: u32,
}

impl Feed {
    /// Tokens in all.
    pub fn total(&self) -> u32 {
        self.len + self.first.is_some() as u32
    }

    /// Token `k` of the feed.
    pub fn token(&self, arena: &Arena, k: u32) -> u32 {
        match (self.first, k) {
            (Some(t), 0) => t,
            (Some(_), k) => arena.get(self.offset + k - 1, 1)[0],
            (None, k) => arena.get(self.offset + k, 1)[0],
        }
    }
}

/// A `gen` in progress: its limit, stop set and the running sum of log-probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GenState {
    /// Most tokens (`n`).
    pub limit: u32,
    /// Stop set index, or [`NO_STOP`].
    pub stop: u32,
    pub logprob_sum: f32,
}

/// One instance of the VM.
#[derive(Debug, Clone)]
pub struct Instance {
    pub id: u32,
    pub pc: u32,
    pub status: Status,
    pub regs: [u32; N_REGS],
    /// Positions in the KV slot.
    pub pos: u32,
    pub pending: Option<u32>,
    pub presample: Option<Presample>,
    /// `%task`, `%parent` and the current task's tokens.
    pub task: u32,
    pub parent: u32,
    pub task_span: Option<(u32, u32)>,
    /// The last `gen`'s span (the one being generated while `status` is `Gen`) or what `best`
    /// chose.
    pub last: Option<Span>,
    pub seed: u64,
    /// Tokens generated since the last `seed`: the next draw's counter.
    pub draws: u64,
    /// Tokens generated over the whole run (for the host's throughput report).
    pub generated: u64,
    pub feed: Feed,
    pub gen: GenState,
    /// What a `Wait` instance waits for (for a deadlock report); kept after it goes on.
    pub waiting: Waiting,
}

impl Instance {
    /// Instance `id` at the start of a run: pc 0, empty context, seed `run_seed + id`.
    pub fn new(id: u32, run_seed: u64) -> Self {
        Self {
            id,
            pc: 0,
            status: Status::Run,
            regs: [0; N_REGS],
            pos: 0,
            pending: None,
            presample: None,
            task: NO_TASK,
            parent: NO_TASK,
            task_span: None,
            last: None,
            seed: run_seed.wrapping_add(id as u64),
            draws: 0,
            generated: 0,
            feed: Feed::default(),
            gen: GenState::default(),
            waiting: Waiting::Nothing,
        }
    }

    /// `%pos`: tokens in the context, a pending one included.
    pub fn context_len(&self) -> u32 {
        self.pos + self.pending.is_some() as u32
    }

    /// Adds a generated `token` to the span being generated and leaves it pending; returns
    /// whether the span is finished (and with it the `gen`).
    ///
    /// The stops are checked in order: an end-of-generation token, the longest stop-set
    /// sequence the span now ends with, the token limit, a full context.
    pub fn accept(
        &mut self,
        arena: &mut Arena,
        token: u32,
        logprob: f32,
        eog: &[u32],
        stops: &[Vec<Vec<u32>>],
        n_ctx: u32,
    ) -> bool {
        let Some(span) = self.last.as_mut() else {
            return true;
        };
        arena.write(span.offset + span.generated, token);
        span.generated += 1;
        span.len = span.generated;
        self.pending = Some(token);
        self.draws += 1;
        self.generated += 1;
        self.gen.logprob_sum += logprob;
        span.score = self.gen.logprob_sum / span.generated as f32;

        let tokens = arena.get(span.offset, span.generated);
        let mut finish = None;
        if eog.contains(&token) {
            finish = Some((Finish::Eog, 1, 1));
        } else if self.gen.stop != NO_STOP {
            let seqs = stops.get(self.gen.stop as usize).map_or(&[][..], |s| s);
            let longest = seqs
                .iter()
                .enumerate()
                .filter(|(_, s)| tokens.ends_with(s))
                .max_by_key(|(k, s)| (s.len(), usize::MAX - k));
            if let Some((k, s)) = longest {
                finish = Some((Finish::Stop, 2 + k as u32, s.len() as u32));
            }
        }
        if finish.is_none() && span.generated >= self.gen.limit {
            finish = Some((Finish::Length, 0, 0));
        }
        // The pending token now fills the context at `pos + 1`.
        if finish.is_none() && self.pos + 1 >= n_ctx {
            finish = Some((Finish::Context, 0, 0));
        }
        match finish {
            Some((f, stop, trim)) => {
                span.finish = Some(f);
                span.stop = stop;
                span.len = span.generated - trim;
                true
            }
            None => false,
        }
    }
}
