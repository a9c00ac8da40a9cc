//! A scripted engine and helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::VecDeque;

use octoflow_agents::{assemble, AgentError, Event, Program, Run, RunConfig};
use octoflow_core::Draw;
use octoflow_model::testing::{open, tiny_writer, TinyShape, TINY};
use octoflow_model::{
    BatchForward, BatchRow, ModelConfig, ModelError, RowOutput, RowResult, TokenIn,
};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Vocabulary of the fake engine: the 256 byte values, then [`EOG`] and three spare ids.
pub const VOCAB: usize = 260;
/// The fake's end-of-generation token.
pub const EOG: u32 = 256;

/// A program where every live instance ends up waiting for what cannot come: instance 0 for a
/// mailbox no one sends to, the others on an open queue no one pushes to.
pub const STALL_SRC: &str = "
.mailbox m 2
.queue q 2
    bne %id, 0, other
    wait m, 1
    halt
other:
    take q, done
done:
    halt
";

/// One id per byte: tests can predict constants and stop strings.
pub fn bytes(s: &str) -> Vec<u32> {
    s.bytes().map(u32::from).collect()
}

pub fn asm(src: &str) -> Program {
    assemble(src, &bytes).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

/// The next token, from a slot's context (every fed token, the row's own last).
pub type Next = Box<dyn Fn(&[u32]) -> u32>;

/// A deterministic [`BatchForward`]: the logits of a row put a peak on `next(context)`.
///
/// It checks every rule of the batch interface (row count, slots, consecutive positions,
/// positions within the context and not past what the slot holds), so a planner that breaks
/// one fails the test, and keeps each slot's context so tests can read what was fed.
pub struct Fake {
    config: ModelConfig,
    pub n_ctx: usize,
    pub max_rows: usize,
    pub slots: Vec<Vec<u32>>,
    next: Next,
    /// The logit of the peak, from the peak token: varies the scores.
    pub peak: fn(u32) -> f32,
    /// The logits elsewhere, by token.
    pub base: fn(usize) -> f32,
    pub device: bool,
    done: VecDeque<Vec<RowResult>>,
    /// Rows of every step run.
    pub steps: Vec<usize>,
}

impl Fake {
    pub fn new(n_slots: usize, n_ctx: usize, max_rows: usize, next: Next) -> Self {
        let shape = TinyShape {
            n_vocab: VOCAB,
            ..TINY
        };
        let file = open(&tiny_writer("llama", shape, &mut StdRng::seed_from_u64(1)))
            .expect("tiny metadata");
        Self {
            config: ModelConfig::from_gguf(&file).expect("tiny config"),
            n_ctx,
            max_rows,
            slots: vec![Vec::new(); n_slots],
            next,
            peak: |_| 4.0,
            base: |i| (i % 3) as f32 * 0.25,
            device: false,
            done: VecDeque::new(),
            steps: Vec::new(),
        }
    }

    fn logits(&self, context: &[u32]) -> Vec<f32> {
        let next = (self.next)(context) as usize % VOCAB;
        let mut logits: Vec<f32> = (0..VOCAB).map(self.base).collect();
        logits[next] = (self.peak)(next as u32);
        logits
    }
}

fn bad<T>(msg: String) -> Result<T, ModelError> {
    Err(ModelError::Batch(msg))
}

impl BatchForward for Fake {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn n_slots(&self) -> usize {
        self.slots.len()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn max_rows(&self) -> usize {
        self.max_rows
    }

    fn device_samples(&self, _draw: &Draw) -> bool {
        self.device
    }

    fn submit(&mut self, rows: &[BatchRow]) -> Result<(), ModelError> {
        if rows.is_empty() || rows.len() > self.max_rows {
            return bad(format!("{} rows (max {})", rows.len(), self.max_rows));
        }
        let mut seen: Vec<(u32, u32)> = Vec::new();
        let mut results = Vec::with_capacity(rows.len());
        for (i, row) in rows.iter().enumerate() {
            let slot = row.slot as usize;
            if slot >= self.slots.len() || row.pos as usize >= self.n_ctx {
                return bad(format!("row {i}: slot {slot} pos {}", row.pos));
            }
            let TokenIn::Id(token) = row.token else {
                return bad(format!("row {i}: TokenIn::Sampled"));
            };
            if token as usize >= VOCAB || row.adapter.is_some() {
                return bad(format!("row {i}: token {token}"));
            }
            match seen.iter_mut().find(|(s, _)| *s == row.slot) {
                Some((_, last)) if *last + 1 == row.pos => *last = row.pos,
                Some((_, last)) => {
                    return bad(format!("row {i}: slot {slot} at {} after {last}", row.pos))
                }
                None => {
                    if row.pos as usize > self.slots[slot].len() {
                        return bad(format!(
                            "row {i}: slot {slot} starts at {} past its {} positions",
                            row.pos,
                            self.slots[slot].len()
                        ));
                    }
                    if let Some(j) = rows[i + 1..].iter().position(|r| r.slot == row.slot) {
                        // Rows of a slot must be consecutive in the step: no other slot's
                        // row between them.
                        let between = &rows[i + 1..i + 1 + j];
                        if between.iter().any(|r| r.slot != row.slot) {
                            return bad(format!("row {i}: slot {slot}'s rows are interleaved"));
                        }
                    }
                    self.slots[slot].truncate(row.pos as usize);
                    seen.push((row.slot, row.pos));
                }
            }
            self.slots[slot].push(token);
            results.push(match row.output {
                RowOutput::None => RowResult::None,
                RowOutput::Logits => RowResult::Logits(self.logits(&self.slots[slot])),
                RowOutput::Sample(draw) => {
                    if !self.device {
                        return bad(format!("row {i}: device sampling is off"));
                    }
                    let logits = self.logits(&self.slots[slot]);
                    let token = draw.sample_cpu(&logits);
                    let logprob = octoflow_core::sampling::logprob(&logits, token);
                    RowResult::Token { token, logprob }
                }
            });
        }
        self.steps.push(rows.len());
        self.done.push_back(results);
        Ok(())
    }

    fn collect(&mut self) -> Result<Vec<RowResult>, ModelError> {
        self.done
            .pop_front()
            .ok_or_else(|| ModelError::Batch("nothing in flight".into()))
    }

    fn pending(&self) -> usize {
        self.done.len()
    }
}

/// Greedy, `instances` instances, the fake's EOG.
pub fn config(instances: usize, max_tokens: u32) -> RunConfig {
    RunConfig {
        instances,
        max_tokens,
        temperature: 0.0,
        eog: vec![EOG],
        ..RunConfig::default()
    }
}

/// Steps `run` to the end (at most `limit` steps); returns every event.
pub fn finish(
    run: &mut Run,
    engine: &mut dyn BatchForward,
    limit: usize,
) -> Result<Vec<Event>, AgentError> {
    let mut events = Vec::new();
    for _ in 0..limit {
        if run.finished() {
            return Ok(events);
        }
        let r = run.step(engine);
        events.extend(run.events());
        r?;
    }
    panic!("the run did not finish in {limit} steps");
}

/// Starts and finishes `src` on `engine`; panics on a start error.
pub fn run_src(
    src: &str,
    cfg: RunConfig,
    tasks: Vec<Vec<u32>>,
    engine: &mut dyn BatchForward,
) -> Result<Vec<Event>, AgentError> {
    let mut run = Run::new(asm(src), cfg, tasks, engine).expect("run starts");
    finish(&mut run, engine, 100_000)
}

/// The outputs among `events`: (instance, task, round, tokens).
pub fn outputs(events: &[Event]) -> Vec<(u32, Option<u32>, u32, Vec<u32>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Output {
                instance,
                task,
                round,
                tokens,
                ..
            } => Some((*instance, *task, *round, tokens.clone())),
            _ => None,
        })
        .collect()
}

/// The error messages among `events`.
pub fn errors(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Error { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

/// `next` = the last token + 1 (wrapping in the byte range).
pub fn successor() -> Next {
    Box::new(|ctx: &[u32]| ctx.last().map_or(0, |&t| (t + 1) % 256))
}
