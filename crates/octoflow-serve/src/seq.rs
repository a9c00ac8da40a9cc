//! One choice of one request in one instance: its prompt progress, its sampler, and turning its
//! sampled tokens into text events (through the shared [`Choice`]: streaming detokenization,
//! stop strings, end-of-generation, limits) with metrics and log-probabilities.

use std::sync::Arc;
use std::time::Instant;

use octoflow_core::sampling::{softmax, Sampler};
use octoflow_core::{Draw, Finish, TokenMask};
use octoflow_generate::{Choice, Constraint, ConstraintError, Limits};
use octoflow_model::BatchForward;
use octoflow_text::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::job::{Event, Job, TokenLogprob};
use crate::metrics::Metrics;

/// A sequence in an instance.
pub struct Seq<'t> {
    /// Unique among all sequences ever started (results of steps still in flight for a
    /// sequence that ended are recognised by it and dropped).
    pub id: u64,
    /// Choice index within the request.
    pub index: usize,
    pub prompt: Arc<[u32]>,
    /// The LoRA adapter its rows run with (`None`: the base model).
    pub adapter: Option<u32>,
    /// Prompt tokens submitted so far.
    pub fed: usize,
    /// Position of the next row to submit.
    pub next_pos: usize,
    /// Sample on the device ([`octoflow_model::RowOutput::Sample`]) rather than from logits.
    pub device: bool,
    /// A sampled token read back and not yet fed.
    pub pending: Option<u32>,
    /// Rows asking for a token submitted so far (never more than `max_tokens`).
    pub requested: usize,
    pub max_tokens: usize,
    /// Its counter also counts the draws submitted to the device.
    sampler: Sampler,
    /// The grammar its output follows: its tokens are drawn under the grammar's mask (on the
    /// device, or on the CPU from the logits), computed once the previous token is known.
    constraint: Option<Constraint>,
    logprobs: Option<usize>,
    choice: Choice<'t>,
    tokenizer: &'t Tokenizer,
    metrics: &'t Metrics,
    events: UnboundedSender<Event>,
    enqueued: Instant,
    /// The end of the choice, sent when the sequence is dropped ([`Seq::finish`]).
    done: Option<Event>,
    /// The tokens generated so far, in order (what the positions after the prompt run).
    tokens: Vec<u32>,
}

/// What handling a token decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Generation goes on.
    Continue,
    /// The choice ended (its `Done` event was sent).
    Finished,
}

impl<'t> Seq<'t> {
    /// Choice `index` of `job`, run by `engine`.
    pub fn new(
        id: u64,
        index: usize,
        job: &Job,
        engine: &dyn BatchForward,
        tokenizer: &'t Tokenizer,
        metrics: &'t Metrics,
    ) -> Self {
        let p = &job.params;
        let mut params = p.sampling.clone();
        params.seed = params.seed.wrapping_add(index as u64);
        let mut sampler = Sampler::new(params);
        for &t in job.prompt.iter() {
            sampler.accept(t);
        }
        // Log-probabilities need the logits on the CPU; a grammar's mask goes to the device's
        // draw where the engine takes masks.
        let device = p.logprobs.is_none()
            && (p.constraint.is_none() || engine.device_masks())
            && Draw::from_sampler(&sampler).is_some_and(|d| engine.device_samples(&d));
        let limits = Limits {
            max_tokens: Some(p.max_tokens),
            stops: p.stops.clone(),
            ignore_eos: p.ignore_eos,
        };
        Self {
            id,
            index,
            prompt: job.prompt.clone(),
            adapter: job.adapter,
            fed: 0,
            next_pos: 0,
            device,
            pending: None,
            requested: 0,
            max_tokens: p.max_tokens,
            sampler,
            constraint: p.constraint.clone(),
            logprobs: p.logprobs,
            choice: Choice::new(tokenizer, &limits, job.prompt.len(), engine.n_ctx()),
            tokenizer,
            metrics,
            events: job.events.clone(),
            enqueued: job.enqueued,
            tokens: Vec::new(),
            done: None,
        }
    }

    /// Starts after the first `n` prompt tokens, which the instance's cache already holds.
    pub fn reuse_prompt(&mut self, n: usize) {
        let n = n.min(self.prompt.len().saturating_sub(1));
        self.fed = n;
        self.next_pos = n;
    }

    /// The tokens at the positions this sequence ran (or has in flight): the prompt fed so far
    /// and the generated tokens, up to the next position to run.
    pub fn written(&self) -> Vec<u32> {
        let mut t: Vec<u32> = self.prompt[..self.fed].to_vec();
        if self.prefilled() {
            t.extend_from_slice(&self.tokens);
        }
        t.truncate(self.next_pos);
        t
    }

    /// The next device draw (advances the draw counter). Only for `device` sequences.
    pub fn next_draw(&mut self) -> Option<Draw> {
        let draw = Draw::from_sampler(&self.sampler).filter(|_| self.device)?;
        self.sampler.skip(1);
        Some(draw)
    }

    /// Whether a grammar holds its output.
    pub fn constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// The grammar's mask for the next token (`None` without a grammar).
    pub fn next_mask(&mut self) -> Option<Result<TokenMask, ConstraintError>> {
        self.constraint.as_mut().map(Constraint::mask)
    }

    /// Advances the grammar past a token the device drew under its mask.
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        match &mut self.constraint {
            Some(c) => c.commit(token),
            None => Ok(()),
        }
    }

    /// Whether the prompt has been submitted completely.
    pub fn prefilled(&self) -> bool {
        self.fed == self.prompt.len()
    }

    /// Whether the client went away.
    pub fn disconnected(&self) -> bool {
        self.events.is_closed()
    }

    /// Samples from a row of logits on the CPU (penalties, log-probabilities, a grammar's
    /// mask, which then takes the token). Errs when the grammar fails.
    pub fn sample_logits(
        &mut self,
        logits: &[f32],
    ) -> Result<(u32, Option<TokenLogprob>), ConstraintError> {
        let token = match &mut self.constraint {
            None => self.sampler.sample(logits),
            Some(c) => {
                let mask = c.mask()?;
                let token = self.sampler.sample_masked(logits, &mask).ok_or_else(|| {
                    ConstraintError::Decode("the grammar allows no token here".into())
                })?;
                c.commit(token)?;
                token
            }
        };
        let lp = self.logprobs.map(|k| self.logprob(logits, token, k));
        Ok((token, lp))
    }

    fn piece(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = self.tokenizer.token_to_piece(id, false).to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// The log-probability of `token` and the `k` most likely tokens under `logits`.
    fn logprob(&self, logits: &[f32], token: u32, k: usize) -> TokenLogprob {
        let probs = softmax(
            logits
                .iter()
                .map(|&v| if v.is_nan() { f32::MIN } else { v }),
        );
        let ln = |p: f32| p.max(f32::MIN_POSITIVE).ln();
        let mut order: Vec<u32> = (0..probs.len() as u32).collect();
        let k = k.min(order.len());
        if k > 0 {
            order.select_nth_unstable_by(k - 1, |&a, &b| {
                probs[b as usize].total_cmp(&probs[a as usize])
            });
        }
        order.truncate(k);
        order.sort_by(|&a, &b| probs[b as usize].total_cmp(&probs[a as usize]));
        let (text, bytes) = self.piece(token);
        TokenLogprob {
            token: text,
            bytes,
            logprob: ln(probs.get(token as usize).copied().unwrap_or(0.0)),
            top: order
                .into_iter()
                .map(|id| {
                    let (t, b) = self.piece(id);
                    (t, b, ln(probs[id as usize]))
                })
                .collect(),
        }
    }

    /// Takes a sampled token: emits its text and decides whether the choice ends.
    pub fn push(&mut self, token: u32, logprob: Option<TokenLogprob>) -> Outcome {
        if self.choice.generated() == 0 {
            self.metrics.first_token(self.enqueued.elapsed());
        }
        Metrics::inc(&self.metrics.generation_tokens);
        self.tokens.push(token);
        self.sampler.accept(token);
        let release = self.choice.push(token);
        self.send_text(release.text, logprob);
        match release.finish {
            Some(finish) => self.finish(finish),
            None => Outcome::Continue,
        }
    }

    fn send_text(&self, text: String, logprob: Option<TokenLogprob>) {
        if !text.is_empty() || logprob.is_some() {
            let _ = self.events.send(Event::Delta {
                index: self.index,
                text,
                logprob,
            });
        }
    }

    /// Ends the choice. Its `Done` event goes out when the sequence is dropped — after the
    /// scheduler has freed its instance, so that a client that asks again at once finds the
    /// instance free.
    fn finish(&mut self, finish: Finish) -> Outcome {
        self.done = Some(Event::Done {
            index: self.index,
            finish,
            completion_tokens: self.choice.generated(),
        });
        Outcome::Finished
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.choice.generated()
    }

    /// Ends the choice with an error event (shutdown, engine failure).
    pub fn fail(&self, message: &str) {
        let _ = self.events.send(Event::Error {
            message: message.to_string(),
        });
    }
}

impl Drop for Seq<'_> {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            let _ = self.events.send(done);
        }
    }
}
