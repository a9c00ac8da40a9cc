//! What travels between the HTTP handlers and the scheduler thread: [`Work`] (a [`Job`]: one
//! request, its prompt tokens and parameters; or an agent run) through the bounded [`Queue`],
//! and [`Event`]s back through the job's channel.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use octoflow_core::{Finish, SamplingParams};
use octoflow_generate::Constraint;
use tokio::sync::mpsc::UnboundedSender;

use crate::agents::job::{AgentJob, AgentMsg};

/// How a request generates.
#[derive(Debug, Clone)]
pub struct GenParams {
    /// Sampling parameters (choice `i` of `n` uses `seed + i`).
    pub sampling: SamplingParams,
    /// Most tokens per choice (already clamped to the context).
    pub max_tokens: usize,
    /// Stop strings (not included in the text).
    pub stops: Vec<String>,
    /// Choices: each runs in its own instance.
    pub n: usize,
    /// `Some(k)`: return each token's log-probability and the `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Keep generating after end-of-generation tokens.
    pub ignore_eos: bool,
    /// The grammar every choice's output must match (compiled; each choice takes a copy).
    pub constraint: Option<Constraint>,
}

/// One request waiting for or holding instances.
#[derive(Debug)]
pub struct Job {
    /// Prompt token ids (non-empty, shorter than the context).
    pub prompt: Arc<[u32]>,
    /// Generation parameters.
    pub params: GenParams,
    /// The LoRA adapter it runs with (`None`: the base model).
    pub adapter: Option<u32>,
    /// Where the scheduler sends this request's events; closed when the client went away.
    pub events: UnboundedSender<Event>,
    /// When the request was queued (for the time-to-first-token metric).
    pub enqueued: Instant,
}

/// What waits in the queue: a completion request or an agent run. Either needs a number of
/// free instances at once (`n` choices; the run's instances).
#[derive(Debug)]
pub enum Work {
    Generate(Job),
    Agents(AgentJob),
}

impl Work {
    /// Free instances it needs to be admitted.
    pub fn instances(&self) -> usize {
        match self {
            Work::Generate(j) => j.params.n,
            Work::Agents(a) => a.config.instances,
        }
    }

    /// Whether its client went away while it waited.
    pub fn abandoned(&self) -> bool {
        match self {
            Work::Generate(j) => j.events.is_closed(),
            Work::Agents(a) => a.events.is_closed(),
        }
    }

    /// Ends it unadmitted with `message` (shutdown).
    pub fn refuse(self, message: &str) {
        match self {
            Work::Generate(j) => {
                let _ = j.events.send(Event::Error {
                    message: message.into(),
                });
            }
            Work::Agents(a) => {
                let _ = a.events.send(AgentMsg::Failed {
                    message: message.into(),
                    code: "shutting_down",
                });
            }
        }
    }
}

/// The log-probability of one generated token and its most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text (lossy UTF-8 of its bytes).
    pub token: String,
    /// The token's bytes.
    pub bytes: Vec<u8>,
    /// Natural log of its probability under the model (before penalties).
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first: text, bytes, logprob.
    pub top: Vec<(String, Vec<u8>, f32)>,
}

/// What the scheduler reports about a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New text of choice `index` (possibly empty when only `logprob` is new).
    Delta {
        index: usize,
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// Choice `index` ended after `completion_tokens` tokens.
    Done {
        index: usize,
        finish: Finish,
        completion_tokens: usize,
    },
    /// The request failed or was cancelled (shutdown, engine error); no more events follow.
    Error { message: String },
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `cap` jobs are already waiting.
    Full(usize),
    /// The server is shutting down.
    Closed,
}

#[derive(Debug, Default)]
struct State {
    jobs: VecDeque<Work>,
    closed: bool,
    /// Instances the scheduler last found free: jobs up to this many are about to be taken,
    /// not waiting.
    idle: usize,
}

/// The bounded queue of jobs waiting for free instances: `cap` jobs may wait beyond what the
/// idle instances are about to take (so `cap` 0 still serves an idle server). Jobs whose
/// client went away give their places up.
#[derive(Debug)]
pub struct Queue {
    state: Mutex<State>,
    ready: Condvar,
    cap: usize,
}

impl Queue {
    /// A queue holding at most `cap` waiting jobs.
    pub fn new(cap: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            ready: Condvar::new(),
            cap,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a consistent VecDeque: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a job, or says why not.
    pub fn push(&self, job: Work) -> Result<(), Refused> {
        let mut s = self.lock();
        if s.closed {
            return Err(Refused::Closed);
        }
        if s.jobs.len() >= self.cap + s.idle {
            s.jobs.retain(|w| !w.abandoned());
        }
        if s.jobs.len() >= self.cap + s.idle {
            return Err(Refused::Full(self.cap));
        }
        s.jobs.push_back(job);
        self.ready.notify_all();
        Ok(())
    }

    /// The scheduler's count of free instances after it admitted what fits.
    pub fn set_idle(&self, idle: usize) {
        self.lock().idle = idle;
    }

    /// Takes the oldest job if `fits` accepts it (it needs that many free instances).
    pub fn pop_if(&self, fits: impl FnOnce(&Work) -> bool) -> Option<Work> {
        let mut s = self.lock();
        if s.jobs.front().is_some_and(fits) {
            s.jobs.pop_front()
        } else {
            None
        }
    }

    /// Jobs waiting.
    pub fn len(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Whether no job is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Refuses new jobs from now on and wakes the scheduler.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Whether [`Queue::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Removes and returns every waiting job.
    pub fn drain(&self) -> Vec<Work> {
        self.lock().jobs.drain(..).collect()
    }

    /// Blocks until a job is waiting, the queue is closed, or `timeout` passes.
    pub fn wait(&self, timeout: Duration) {
        let s = self.lock();
        if s.jobs.is_empty() && !s.closed {
            let _unused = self.ready.wait_timeout(s, timeout);
        }
    }
}
