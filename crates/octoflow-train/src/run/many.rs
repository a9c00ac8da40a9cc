//! Several runs at once over one shared base model: [`train_many`].
//!
//! Every run has its own [`Trainer`] (adapters, optimizer state, scratch) over the same
//! `Arc<GpuModel>`, its own queue, directory, checkpoint and log. The scheduler keeps every
//! unfinished run's micro-step in flight: it submits each run's first micro-step, then visits
//! the runs round-robin, waiting for one run's micro-step (and doing its optimizer step,
//! evaluation and checkpoint when that was the step's last) and submitting that run's next one
//! before moving on, so the other runs' work overlaps on the GPU meanwhile. A run whose plan is
//! done is finished and drops out. A run's numbers depend only on its own trainer and data, so
//! its losses are those it logs when trained alone.

use crate::error::{Result, TrainError};
use crate::gpu::Trainer;

use super::{Observer, Run, RunInputs, Summary, TrainConfig};

/// One run of [`train_many`]: its trainer (over the shared model), options, inputs and
/// progress hooks.
pub struct RunSlot<'a> {
    /// The run's own trainer; several slots' trainers share one `Arc<GpuModel>`.
    pub trainer: &'a mut Trainer,
    /// The run's options.
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

/// Trains every run concurrently (see the module doc); run `i` submits to queue `i` (modulo
/// the device's queue count). Returns the summaries in the order of `runs`. The first error
/// stops every run and names the run directory it came from.
pub fn train_many(runs: Vec<RunSlot<'_>>) -> Result<Vec<Summary>> {
    let mut slots = Vec::with_capacity(runs.len());
    for (i, s) in runs.into_iter().enumerate() {
        in_run(s.inputs, s.trainer.set_queue(i))?;
        let run = in_run(s.inputs, Run::start(s.trainer, s.cfg, s.inputs, s.observer))?;
        slots.push((s, Some(run)));
    }
    let mut sums: Vec<Option<Summary>> = (0..slots.len()).map(|_| None).collect();
    // every run's first micro-step in flight before waiting on any
    let mut active = Vec::with_capacity(slots.len());
    for (i, (s, run)) in slots.iter_mut().enumerate() {
        let Some(r) = run.as_mut() else { continue };
        if in_run(s.inputs, r.submit_micro(s.trainer))? {
            active.push(i);
        } else if let Some(r) = run.take() {
            sums[i] = Some(in_run(s.inputs, r.finish(s.trainer, s.observer))?);
        }
    }
    while !active.is_empty() {
        let mut still = Vec::with_capacity(active.len());
        for &i in &active {
            let (s, run) = &mut slots[i];
            let Some(r) = run.as_mut() else { continue };
            in_run(s.inputs, r.finish_micro(s.trainer, s.observer))?;
            if in_run(s.inputs, r.submit_micro(s.trainer))? {
                still.push(i);
            } else if let Some(r) = run.take() {
                sums[i] = Some(in_run(s.inputs, r.finish(s.trainer, s.observer))?);
            }
        }
        active = still;
    }
    sums.into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.ok_or_else(|| TrainError::Config(format!("run {i} ended without a summary")))
        })
        .collect()
}
