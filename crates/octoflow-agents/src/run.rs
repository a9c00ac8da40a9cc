//! A run: many instances of one program over a [`BatchForward`], stepped by the caller.
//!
//! ```text
//! let mut run = Run::new(program, config, tasks, &engine)?;
//! while !run.finished() {
//!     run.step(&mut engine)?;
//!     for event in run.events() { ... }
//! }
//! ```
//! Each step interprets every instance that can run, plans the rows, runs them as one batched
//! forward pass and hands each instance its results (docs/VM.md, "A step").

use octoflow_core::SamplingParams;
use octoflow_model::{BatchForward, RowResult};

use crate::error::{AgentError, StartError};
use crate::event::Event;
use crate::interp::{interpret, Ctx, Env};
use crate::memory::{Arena, Mailbox, Memory, Queue, Task};
use crate::plan::{advance, plan, Draws, Owner, Plan};
use crate::program::{Capacity, CapacityEnv, Program};
use crate::sample::Sampling;
use crate::state::{Instance, Status, Waiting};

/// How a run is configured (the CLI's flags).
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// Instances (`%n`); instance `i` uses the engine's KV slot `i`.
    pub instances: usize,
    /// The token limit programs read as `%max` (`-n`).
    pub max_tokens: u32,
    /// `%rounds` (`--rounds`).
    pub rounds: u32,
    /// Instance `i` starts with seed `seed + i`; `seed x` sets `seed + x`.
    pub seed: u64,
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    /// The model's end-of-generation token ids: a span stops after one.
    pub eog: Vec<u32>,
    /// Most prompt rows one instance gets per step (the engine's prefill chunk).
    pub chunk: usize,
    /// Arena capacity in tokens (constants, tasks, pushed tasks and every `gen`'s span).
    pub arena_tokens: usize,
    /// Ask the engine to sample on the device where it can ([`BatchForward::device_samples`]);
    /// the engine's log-probabilities then score the spans (the GPU's sum rounds differently
    /// from the host's, so a near-tie in `best` may go the other way: docs/VM.md, "Scores").
    pub device_sampling: bool,
}

impl Default for RunConfig {
    fn default() -> Self {
        let p = SamplingParams::default();
        Self {
            instances: 1,
            max_tokens: 256,
            rounds: 1,
            seed: 0,
            temperature: p.temperature,
            top_k: p.top_k as u32,
            top_p: p.top_p,
            min_p: p.min_p,
            eog: Vec::new(),
            chunk: 256,
            arena_tokens: 1 << 24,
            device_sampling: false,
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepReport {
    /// The step's number (from 0).
    pub step: u64,
    /// Rows run: one per generating instance, prompt rows of feeding ones.
    pub rows: usize,
    /// Of them, rows of generating instances.
    pub gen_rows: usize,
    /// Instances neither halted nor failed after the step.
    pub live: usize,
}

/// The largest queue or mailbox: indices are u32.
const MAX_CAPACITY: u64 = u32::MAX as u64;

/// A run in progress. Cloning copies its whole state (the GPU tests compare phase by phase).
#[derive(Clone)]
pub struct Run {
    pub(crate) program: Program,
    pub(crate) env: Env,
    pub(crate) draws: Draws,
    pub(crate) chunk: usize,
    pub(crate) instances: Vec<Instance>,
    pub(crate) mem: Memory,
    pub(crate) events: Vec<Event>,
    pub(crate) step: u64,
}

impl Run {
    /// Starts `program` with `config` on `tasks` (token ids of each host task, `tasks` queue),
    /// checking it against `engine` (KV slots, context, vocabulary) and evaluating capacities.
    pub fn new(
        program: Program,
        config: RunConfig,
        tasks: Vec<Vec<u32>>,
        engine: &dyn BatchForward,
    ) -> Result<Self, StartError> {
        check_config(&config, engine)?;
        if tasks.len() >= u32::MAX as usize {
            return Err(StartError::TooManyTasks(tasks.len()));
        }
        let n_vocab = engine.config().n_vocab;
        check_vocab(&program, &config, &tasks, n_vocab)?;
        let cap_env = CapacityEnv {
            n: config.instances,
            tasks: tasks.len(),
            rounds: config.rounds as usize,
        };
        let eval = |what, name: &str, cap: &Capacity| {
            let value = cap.eval(cap_env);
            if value > MAX_CAPACITY {
                return Err(StartError::Capacity {
                    what,
                    name: name.into(),
                    expr: cap.to_string(),
                    value,
                    limit: MAX_CAPACITY,
                    n: cap_env.n,
                    tasks: cap_env.tasks,
                    rounds: cap_env.rounds,
                });
            }
            Ok(value as u32)
        };
        let mut queues = Vec::new();
        for q in program.queues.iter().skip(1) {
            queues.push(Queue::new(&q.name, eval("queue", &q.name, &q.value)?));
        }
        let mut mailboxes = Vec::new();
        for m in &program.mailboxes {
            mailboxes.push(Mailbox::new(&m.name, eval("mailbox", &m.name, &m.value)?));
        }

        let needed: u64 = program
            .consts
            .iter()
            .map(|c| c.value.len() as u64)
            .chain(tasks.iter().map(|t| t.len() as u64))
            .sum();
        if needed > config.arena_tokens as u64 {
            return Err(StartError::ArenaTooSmall {
                needed,
                capacity: config.arena_tokens,
            });
        }
        let mut arena = Arena::new(config.arena_tokens);
        let too_small = |_| StartError::ArenaTooSmall {
            needed,
            capacity: config.arena_tokens,
        };
        let mut consts = Vec::new();
        for c in &program.consts {
            consts.push((
                arena.put(&c.value).map_err(too_small)?,
                c.value.len() as u32,
            ));
        }
        let mut host = Vec::new();
        for (i, t) in tasks.iter().enumerate() {
            host.push(Task {
                offset: arena.put(t).map_err(too_small)?,
                len: t.len() as u32,
                parent: i as u32,
            });
        }
        queues.insert(0, Queue::host(host));

        let env = Env {
            n: config.instances as u32,
            tasks: tasks.len() as u32,
            max: config.max_tokens,
            rounds: config.rounds,
            seed: config.seed,
            n_ctx: engine.n_ctx().min(u32::MAX as usize) as u32,
            eog: config.eog.clone(),
        };
        let sampling = Sampling {
            temperature: config.temperature,
            top_k: config.top_k,
            top_p: config.top_p,
            min_p: config.min_p,
        };
        // The engine's sampled rows carry their log-probabilities, so `best` needs no logits.
        let on_device =
            config.device_sampling && engine.device_samples(&sampling.draw(config.seed, 0));
        Ok(Self {
            mem: Memory {
                arena,
                queues,
                mailboxes,
                consts,
                stops: program.stops.iter().map(|s| s.value.clone()).collect(),
            },
            instances: (0..config.instances as u32)
                .map(|i| Instance::new(i, config.seed))
                .collect(),
            program,
            env,
            draws: Draws {
                sampling,
                on_device,
            },
            chunk: config.chunk,
            events: Vec::new(),
            step: 0,
        })
    }

    /// Whether every instance has halted or failed.
    pub fn finished(&self) -> bool {
        !self.instances.iter().any(|i| i.status.is_live())
    }

    /// Whether rows ask the engine to sample (scores then come from the engine too).
    pub fn samples_on_device(&self) -> bool {
        self.draws.on_device
    }

    /// Tokens generated so far, by every instance.
    pub fn generated(&self) -> u64 {
        self.instances.iter().map(|i| i.generated).sum()
    }

    /// Steps run so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Instance `i`'s state (for inspection and tests).
    pub fn instance(&self, i: usize) -> Option<&Instance> {
        self.instances.get(i)
    }

    /// Arena tokens taken so far.
    pub fn arena_used(&self) -> usize {
        self.mem.arena.used()
    }

    /// The events since the last call, in order.
    pub fn events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// Runs one step: interpret, plan rows, one batched forward pass on `engine`, advance.
    ///
    /// Fails as a whole on an engine error, or with a deadlock when nothing ran and nothing
    /// changed; a runtime error of one instance becomes an [`Event::Error`] instead.
    pub fn step(&mut self, engine: &mut dyn BatchForward) -> Result<StepReport, AgentError> {
        if engine.pending() != 0 {
            return Err(AgentError::EngineBusy(engine.pending()));
        }
        let changed = self.interpret_phase();
        let plan = self.plan_phase(engine.max_rows().max(1));
        if !plan.rows.is_empty() {
            let results = engine.step(&plan.rows)?;
            if results.len() != plan.rows.len() {
                return Err(AgentError::EngineResult {
                    row: results.len().min(plan.rows.len()),
                    asked: "one result per row",
                    found: format!("{} results for {} rows", results.len(), plan.rows.len()),
                });
            }
            self.advance_phase(&plan.owners, &results)?;
        }
        self.end_step(plan.rows.len(), plan.gen_rows, changed)
    }

    /// Phase 1 of the step (docs/VM.md, "A step"): every instance in state `run` or `wait`
    /// executes until it yields, in instance order. Returns whether anything changed.
    pub fn interpret_phase(&mut self) -> bool {
        let order: Vec<u32> = (0..self.instances.len() as u32).collect();
        self.interpret_phase_in(&order)
    }

    /// [`Run::interpret_phase`] with the instances interpreted in `order` (each at most once;
    /// indices past the run are skipped). Only which instance gets which task when several
    /// `take` in one step depends on the order (docs/VM.md, "Visibility"): the GPU tests replay
    /// the order the GPU's takes happened in.
    pub fn interpret_phase_in(&mut self, order: &[u32]) -> bool {
        let mut changed = false;
        let mut cx = Ctx {
            program: &self.program,
            mem: &mut self.mem,
            env: &self.env,
            now: self.step,
            events: &mut self.events,
        };
        for &i in order {
            let Some(inst) = self.instances.get_mut(i as usize) else {
                continue;
            };
            if matches!(inst.status, Status::Run | Status::Wait) {
                changed |= interpret(inst, &mut cx);
            }
        }
        changed
    }

    /// Phase 2: the rows of the step for an engine of `max_rows` rows.
    pub fn plan_phase(&self, max_rows: usize) -> Plan {
        plan(
            &self.instances,
            &self.mem,
            &self.draws,
            self.chunk,
            max_rows,
        )
    }

    /// Phase 3: the instances take the results of the rows `owners` describes.
    pub fn advance_phase(
        &mut self,
        owners: &[Owner],
        results: &[RowResult],
    ) -> Result<(), AgentError> {
        advance(
            &mut self.instances,
            &mut self.mem,
            &self.env,
            &self.draws,
            owners,
            results,
        )
    }

    /// Ends the step that ran `rows` rows (`gen_rows` of generating instances) after an
    /// interpret phase that `changed` something: counts it and detects a deadlock.
    pub fn end_step(
        &mut self,
        rows: usize,
        gen_rows: usize,
        changed: bool,
    ) -> Result<StepReport, AgentError> {
        let now = self.step;
        self.step += 1;
        let live = self.instances.iter().filter(|i| i.status.is_live()).count();
        if rows == 0 && !changed && live > 0 {
            return Err(AgentError::Deadlock(self.deadlock_report()));
        }
        Ok(StepReport {
            step: now,
            rows,
            gen_rows,
            live,
        })
    }

    /// Every draw asks the engine to sample on the device from now on: the GPU interpreter's
    /// mode (tokens and their log-probabilities, so the scores `best` compares, come from the
    /// engine's sampler). The engine must sample on the device.
    pub fn set_device_sampling(&mut self, on: bool) {
        self.draws.on_device = on;
    }

    /// The sampling parameters every draw shares.
    pub fn sampling(&self) -> Sampling {
        self.draws.sampling
    }

    /// The run's program.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// What the run fixes for every instance (specials, context, end-of-generation tokens).
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// Most prompt rows one instance gets per step.
    pub fn chunk(&self) -> usize {
        self.chunk
    }

    /// Every instance's state.
    pub fn instances(&self) -> &[Instance] {
        &self.instances
    }

    /// The shared memory: arena, queues, mailboxes, constants and stop sets.
    pub fn memory(&self) -> &Memory {
        &self.mem
    }

    /// What every live instance waits for (the deadlock error's lines).
    pub(crate) fn deadlock_report(&self) -> Vec<String> {
        self.instances
            .iter()
            .filter(|i| i.status.is_live())
            .map(|i| {
                format!(
                    "instance {} at {}: {}",
                    i.id,
                    self.program.locate(i.pc as usize),
                    self.describe(&i.waiting)
                )
            })
            .collect()
    }

    fn describe(&self, waiting: &Waiting) -> String {
        match *waiting {
            Waiting::Nothing => "nothing".into(),
            Waiting::Mailbox {
                mailbox,
                have,
                count,
            } => {
                let b = self.mem.mailboxes.get(mailbox as usize);
                let name = b.map_or("?", |b| b.name.as_str());
                format!("mailbox `{name}` holds {have} of {count} messages")
            }
            Waiting::Queue {
                queue,
                pushed,
                taken,
            } => {
                let q = self.mem.queues.get(queue as usize);
                let name = q.map_or("?", |q| q.name.as_str());
                format!("queue `{name}` is open and empty ({pushed} pushed, {taken} taken)")
            }
        }
    }
}

fn check_config(c: &RunConfig, engine: &dyn BatchForward) -> Result<(), StartError> {
    if c.instances == 0 {
        return Err(StartError::NoInstances);
    }
    if c.instances > engine.n_slots() || c.instances > u32::MAX as usize {
        return Err(StartError::TooManyInstances {
            instances: c.instances,
            slots: engine.n_slots(),
        });
    }
    for (what, v) in [
        ("max_tokens", c.max_tokens as usize),
        ("rounds", c.rounds as usize),
        ("chunk", c.chunk),
    ] {
        if v == 0 {
            return Err(StartError::Zero(what));
        }
    }
    SamplingParams {
        temperature: c.temperature,
        top_k: c.top_k as usize,
        top_p: c.top_p,
        min_p: c.min_p,
        seed: c.seed,
        ..SamplingParams::default()
    }
    .validate()
    .map_err(StartError::Sampling)
}

/// Every token id the run will feed or compare lies in the vocabulary.
fn check_vocab(
    program: &Program,
    config: &RunConfig,
    tasks: &[Vec<u32>],
    n_vocab: usize,
) -> Result<(), StartError> {
    let check = |what: &dyn Fn() -> String, ids: &[u32]| match ids
        .iter()
        .find(|&&id| id as usize >= n_vocab)
    {
        Some(&id) => Err(StartError::TokenOutOfVocab {
            what: what(),
            id,
            n_vocab,
        }),
        None => Ok(()),
    };
    for c in &program.consts {
        check(&|| format!("constant `{}`", c.name), &c.value)?;
    }
    for s in &program.stops {
        for seq in &s.value {
            check(&|| format!("stop set `{}`", s.name), seq)?;
        }
    }
    for (i, t) in tasks.iter().enumerate() {
        check(&|| format!("task {i}"), t)?;
    }
    check(&|| "the end-of-generation list".into(), &config.eog)
}
