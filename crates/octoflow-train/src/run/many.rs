//! Several runs at once over one shared base model: [`train_many`].
//!
//! The runs are the members of one joint [`Trainer`] (`gpu/member.rs`): each has its own
//! adapters, gradients and AdamW moments, directory, checkpoint and log, but a micro-step is
//! one chain over all of them, their rows stacked in every frozen product. Each round the
//! scheduler asks every unfinished run for its next micro-batch (staged, not submitted),
//! submits the one stacked micro-step, waits, and hands each run its loss, doing a run's
//! optimizer step, evaluation and checkpoint when that was its step's last micro-step. A run
//! whose plan is done is finished and sits out the following rounds (its rows compute nothing
//! anyone reads). A run's numbers depend only on its own adapters and data, so its losses are
//! those it logs when trained alone (up to the summation order of the stacked products).

use octoflow_kernels::AdamWStep;

use crate::backend::Backend;
use crate::error::{Result, TrainError};
use crate::gpu::{Rows, Trainer};
use crate::lora::LoraLayout;

use super::{Observer, Run, RunInputs, Summary, TrainConfig};

/// One run of [`train_many`]: its options, inputs and progress hooks.
pub struct RunSlot<'a> {
    /// The run's options (its trainer member's shape must match: batch, seq-len, adapters).
    pub cfg: &'a TrainConfig,
    /// Data, padding id, run directory and resume flag.
    pub inputs: &'a RunInputs<'a>,
    /// Progress hooks of this run.
    pub observer: &'a mut dyn Observer,
}

/// Names the run an error happened in.
fn in_run<T>(inputs: &RunInputs, r: Result<T>) -> Result<T> {
    r.map_err(|e| TrainError::Run {
        dir: inputs.run_dir.clone(),
        source: Box::new(e),
    })
}

/// Member `g` of a joint trainer as the loop's [`Backend`]: a micro-batch is staged, and the
/// scheduler submits the stacked step.
struct MemberView<'t> {
    t: &'t mut Trainer,
    g: usize,
}

impl Backend for MemberView<'_> {
    fn layout(&self) -> &LoraLayout {
        &self.t.members[self.g].layout
    }
    fn set_params(&mut self, p: &[f32]) -> Result<()> {
        self.t.set_params_of(self.g, p)
    }
    fn params(&self) -> Result<Vec<f32>> {
        self.t.params_of(self.g)
    }
    fn grads(&self) -> Result<Vec<f32>> {
        self.t.grads_of(self.g)
    }
    fn moments(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        self.t.moments_of(self.g)
    }
    fn set_moments(&mut self, m: &[f32], v: &[f32]) -> Result<()> {
        self.t.set_moments_of(self.g, m, v)
    }
    fn submit_micro(&mut self, r: &Rows, seed: u32) -> Result<()> {
        self.t.stage(self.g, r, seed)
    }
    fn finish_micro(&mut self) -> Result<f64> {
        self.t.take_loss(self.g)
    }
    fn eval(&mut self, r: &Rows) -> Result<f64> {
        self.t.eval_of(self.g, r)
    }
    fn optimizer_step(&mut self, step: &AdamWStep) -> Result<f32> {
        self.t.optimizer_step_of(self.g, step)
    }
    fn memory_bytes(&self) -> u64 {
        self.t.device_bytes()
    }
}

/// Trains every run at once as the members of `trainer`, run `i` being member `i` (see the
/// module doc). Returns the summaries in the order of `runs`. The first error stops every run
/// and names the run directory it came from.
pub fn train_many(trainer: &mut Trainer, runs: Vec<RunSlot<'_>>) -> Result<Vec<Summary>> {
    if runs.len() != trainer.members() {
        return Err(TrainError::Config(format!(
            "{} runs for a trainer of {} members",
            runs.len(),
            trainer.members()
        )));
    }
    let mut slots = Vec::with_capacity(runs.len());
    for (g, s) in runs.into_iter().enumerate() {
        let mut v = MemberView { t: trainer, g };
        let run = in_run(s.inputs, Run::start(&mut v, s.cfg, s.inputs, s.observer))?;
        slots.push((s, Some(run)));
    }
    let mut sums: Vec<Option<Summary>> = (0..slots.len()).map(|_| None).collect();
    loop {
        let mut active = Vec::with_capacity(slots.len());
        for (g, (s, run)) in slots.iter_mut().enumerate() {
            let Some(r) = run.as_mut() else { continue };
            let mut v = MemberView { t: trainer, g };
            if in_run(s.inputs, r.submit_micro(&mut v))? {
                active.push(g);
            } else if let Some(r) = run.take() {
                sums[g] = Some(in_run(s.inputs, r.finish(&mut v, s.observer))?);
            }
        }
        if active.is_empty() {
            break;
        }
        trainer.submit_staged()?;
        for g in active {
            let (s, run) = &mut slots[g];
            let Some(r) = run.as_mut() else { continue };
            let mut v = MemberView { t: trainer, g };
            in_run(s.inputs, r.finish_micro(&mut v, s.observer))?;
        }
    }
    sums.into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.ok_or_else(|| TrainError::Config(format!("run {i} ended without a summary")))
        })
        .collect()
}
