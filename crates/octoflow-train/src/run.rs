//! The training loop: epochs of shuffled, packed sequences, micro-batches accumulated into
//! optimizer steps, the learning-rate schedule, evaluation, checkpoints and resume.
//!
//! Everything a resumed run needs to continue exactly is a function of the checkpoint: the
//! adapters and AdamW moments, the step, and the data position (epoch, next step within it);
//! the shuffling and dropout seeds are derived from `(seed, epoch)` and `(seed, step)`, so a run
//! killed at any point and resumed from its last checkpoint reproduces the uninterrupted
//! run's losses.
//!
//! [`Run`] is that loop as a resumable state machine (start, one optimizer step at a time or one
//! micro-step at a time, finish); [`train`] drives one run, [`train_many`] interleaves several
//! runs over one shared base model (see `many.rs`).

mod many;

pub use many::{train_many, RunSlot};

use std::path::{Path, PathBuf};
use std::time::Instant;

use octoflow_kernels::AdamWStep;

use crate::backend::Backend;
use crate::checkpoint::{self, Checkpoint, NamedTensor};
use crate::data::{epoch_order, pack, Example, Sequence, IGNORE};
use crate::error::{Result, TrainError};
use crate::gpu::Rows;
use crate::log::LossLog;
use crate::lora::LoraConfig;
use crate::schedule::{lr_at, Schedule};
use octoflow_model::adapter::Adapter;

/// Every option of a run (saved with each checkpoint; a resume must match it).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainConfig {
    pub lora: LoraConfig,
    pub lr: f32,
    pub weight_decay: f32,
    pub schedule: Schedule,
    pub warmup: u64,
    /// Passes over the training data (ignored when `max_steps` is set).
    pub epochs: u64,
    /// Optimizer steps of the run; overrides `epochs`: the data is gone through as many times
    /// as the steps need, reshuffled each pass.
    pub max_steps: Option<u64>,
    /// Sequences per micro-batch.
    pub batch: usize,
    pub grad_accum: usize,
    pub seq_len: usize,
    /// 0 disables clipping.
    pub max_grad_norm: f32,
    pub seed: u64,
    /// Checkpoint every this many optimizer steps (0: only at the end).
    pub save_every: u64,
    /// Evaluate every this many steps (0: only at the end, when there is an eval set).
    pub eval_every: u64,
    pub beta1: f32,
    pub beta2: f32,
    pub adam_eps: f32,
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy)]
pub struct StepReport {
    /// 1-based step just completed.
    pub step: u64,
    pub total_steps: u64,
    pub epoch: u64,
    /// Mean loss per trained token.
    pub loss: f64,
    pub lr: f32,
    pub grad_norm: f32,
    /// Rows (tokens, padding included) processed by this step and per second.
    pub tokens: u64,
    pub tok_per_s: f64,
    pub elapsed_s: f64,
}

/// Hooks for progress display.
pub trait Observer {
    fn step(&mut self, r: &StepReport);
    fn eval(&mut self, step: u64, loss: f64);
    fn note(&mut self, msg: &str);
}

/// Where a run ended.
#[derive(Debug, Clone)]
pub struct Summary {
    pub steps: u64,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    pub first_eval: Option<f64>,
    pub last_eval: Option<f64>,
    pub tokens: u64,
    pub tok_per_s: f64,
    pub peak_device_bytes: u64,
}

/// The sequences of every epoch and the resulting step count.
struct Plan {
    epochs: Vec<Vec<Sequence>>,
    steps_per_epoch: Vec<u64>,
    total: u64,
}

fn plan(cfg: &TrainConfig, train: &[Example], pad: u32) -> Result<Plan> {
    if train.is_empty() {
        return Err(TrainError::Config("the training set is empty".into()));
    }
    if cfg.max_steps == Some(0) || (cfg.max_steps.is_none() && cfg.epochs == 0) {
        return Err(TrainError::Config(
            "nothing to train: --epochs and --max-steps must be at least 1".into(),
        ));
    }
    let per_step = (cfg.batch * cfg.grad_accum) as u64;
    let mut epochs = Vec::new();
    let mut steps_per_epoch = Vec::new();
    let mut total = 0;
    // `max_steps` overrides `epochs` (as in Hugging Face's Trainer): as many passes over the
    // data as its steps need, the last one cut short. Every epoch has a step at least (a trained
    // token is checked below), so the loop ends.
    let more = |e: u64, total: u64| match cfg.max_steps {
        Some(m) => e == 0 || total < m,
        None => e < cfg.epochs,
    };
    let mut e = 0;
    while more(e, total) {
        let order = epoch_order(train.len(), cfg.seed, e);
        let (seqs, stats) = pack(train, &order, cfg.seq_len, pad);
        if stats.trained_tokens == 0 {
            return Err(TrainError::Config(format!(
                "no trained token fits in --seq-len {} ({} of {} examples truncated): raise --seq-len",
                cfg.seq_len,
                stats.truncated,
                train.len()
            )));
        }
        let steps = (seqs.len() as u64).div_ceil(per_step);
        total += steps;
        steps_per_epoch.push(steps);
        epochs.push(seqs);
        e += 1;
    }
    if let Some(m) = cfg.max_steps {
        total = total.min(m);
    }
    Ok(Plan {
        epochs,
        steps_per_epoch,
        total,
    })
}

/// Fills `rows` with `seqs` (padded with empty sequences up to the trainer's batch).
fn rows_of(seqs: &[&Sequence], batch: usize, seq_len: usize, pad: u32, weight: f32) -> Rows {
    let n = batch * seq_len;
    let mut r = Rows {
        ids: Vec::with_capacity(n),
        labels: Vec::with_capacity(n),
        weights: Vec::with_capacity(n),
        pos: Vec::with_capacity(n),
    };
    for s in seqs {
        r.ids.extend_from_slice(&s.ids);
        r.labels.extend_from_slice(&s.labels);
        r.pos.extend_from_slice(&s.pos);
        r.weights.extend(
            s.labels
                .iter()
                .map(|&l| if l == IGNORE { 0.0 } else { weight }),
        );
    }
    r.ids.resize(n, pad);
    r.labels.resize(n, IGNORE);
    r.pos.resize(n, 0);
    r.weights.resize(n, 0.0);
    r
}

fn trained(seqs: &[&Sequence]) -> usize {
    seqs.iter()
        .map(|s| s.labels.iter().filter(|&&l| l != IGNORE).count())
        .sum()
}

/// The rows of the run's first micro-batch (for profiling).
pub fn first_rows(cfg: &TrainConfig, train: &[Example], pad: u32) -> Result<Rows> {
    let plan = plan(cfg, train, pad)?;
    let seqs: Vec<&Sequence> = plan.epochs[0].iter().take(cfg.batch).collect();
    let w = 1.0 / trained(&seqs).max(1) as f32;
    Ok(rows_of(&seqs, cfg.batch, cfg.seq_len, pad, w))
}

/// Mean loss per trained token over `eval` (packed in file order).
pub fn evaluate(t: &mut dyn Backend, cfg: &TrainConfig, eval: &[Example], pad: u32) -> Result<f64> {
    let order: Vec<usize> = (0..eval.len()).collect();
    let (seqs, _) = pack(eval, &order, cfg.seq_len, pad);
    let (mut sum, mut n) = (0.0, 0usize);
    for chunk in seqs.chunks(cfg.batch) {
        let refs: Vec<&Sequence> = chunk.iter().collect();
        n += trained(&refs);
        sum += t.eval(&rows_of(&refs, cfg.batch, cfg.seq_len, pad, 1.0))?;
    }
    if n == 0 {
        return Err(TrainError::Config(
            "the eval set has no trained tokens".into(),
        ));
    }
    Ok(sum / n as f64)
}

/// The dropout seed of micro-step `micro` of optimizer step `step`.
fn micro_seed(seed: u64, step: u64, micro: usize) -> u32 {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (micro as u64) << 48;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

fn save(
    t: &dyn Backend,
    cfg: &TrainConfig,
    dir: &Path,
    step: u64,
    pos: (u64, u64),
    tokens: u64,
) -> Result<()> {
    let n = t.layout().n_params as u64;
    let (m, v) = t.moments()?;
    let tensor = |name: &str, data: Vec<f32>| NamedTensor {
        name: name.into(),
        shape: vec![n],
        data,
    };
    let ck = Checkpoint {
        step,
        epoch: pos.0,
        batch_in_epoch: pos.1,
        tokens,
        config_json: serde_json::to_string(cfg).map_err(|e| TrainError::Config(e.to_string()))?,
        extra: vec![("seed".into(), cfg.seed)],
        tensors: vec![
            tensor("lora.params", t.params()?),
            tensor("adam.m", m),
            tensor("adam.v", v),
        ],
    };
    checkpoint::save(dir, &ck)
}

/// The adapters' parameters of a checkpoint (in the trainer's flat layout) and its config.
pub fn load_adapters(dir: &Path) -> Result<(TrainConfig, Vec<f32>)> {
    let ck = checkpoint::load(dir)?
        .ok_or_else(|| TrainError::Config(format!("{} holds no checkpoint", dir.display())))?;
    let cfg: TrainConfig = serde_json::from_str(&ck.config_json)
        .map_err(|e| TrainError::Config(format!("{}: bad run config: {e}", dir.display())))?;
    let p = take(&ck, "lora.params", dir)?;
    Ok((cfg, p))
}

/// The adapters of the run in `dir` on a model of config `c`, named after the directory.
pub fn load_adapter(dir: &Path, c: &octoflow_model::ModelConfig) -> Result<Adapter> {
    let (cfg, params) = load_adapters(dir)?;
    let layout = crate::lora::LoraLayout::new(&cfg.lora, c);
    let name = dir
        .file_name()
        .map_or_else(|| "lora".into(), |s| s.to_string_lossy().into_owned());
    layout.adapter(&params, cfg.lora.alpha, &name)
}

fn take(ck: &Checkpoint, name: &str, dir: &Path) -> Result<Vec<f32>> {
    ck.tensors
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.data.clone())
        .ok_or_else(|| TrainError::Config(format!("{}: checkpoint lacks {name}", dir.display())))
}

/// Inputs of a run besides the trainer.
pub struct RunInputs<'a> {
    pub train: &'a [Example],
    pub eval: Option<&'a [Example]>,
    /// The id padding rows use.
    pub pad: u32,
    pub run_dir: PathBuf,
    /// Continue from `run_dir`'s checkpoint.
    pub resume: bool,
}

/// Trains `t` per `cfg` (see the module doc): [`Run::start`], [`Run::step`] until it returns
/// false, [`Run::finish`].
pub fn train(
    t: &mut dyn Backend,
    cfg: &TrainConfig,
    inp: &RunInputs,
    obs: &mut dyn Observer,
) -> Result<Summary> {
    let mut run = Run::start(t, cfg, inp, obs)?;
    while run.step(t, obs)? {}
    run.finish(t, obs)
}

/// The optimizer step in progress: its sequences and the micro-steps done so far.
struct Current {
    /// Index of the step's first sequence in its epoch.
    first: usize,
    /// Sequences in the step (`batch × grad_accum`, fewer at an epoch's end).
    len: usize,
    /// Loss weight of each trained row (1 / trained rows of the step).
    weight: f32,
    /// Micro-steps submitted.
    submitted: usize,
    /// Micro-steps finished.
    finished: usize,
    loss: f64,
    t0: Instant,
}

/// One run as a state machine over a trainer it does not own: the data plan, the position, the
/// log and the running summary. The trainer passed to every call must be the one `start` got.
pub struct Run<'a> {
    cfg: TrainConfig,
    inp: &'a RunInputs<'a>,
    plan: Plan,
    step: u64,
    epoch: u64,
    in_epoch: u64,
    tokens: u64,
    tokens_at_start: u64,
    log: LossLog,
    sum: Summary,
    start: Instant,
    cur: Option<Current>,
}

impl<'a> Run<'a> {
    /// Creates the run directory, plans the epochs, resumes from the checkpoint (`inp.resume`)
    /// or initializes the adapters, opens the log and runs the step-0 evaluation (fresh runs
    /// with `eval_every > 0`).
    pub fn start(
        t: &mut dyn Backend,
        cfg: &TrainConfig,
        inp: &'a RunInputs<'a>,
        obs: &mut dyn Observer,
    ) -> Result<Self> {
        let dir = &inp.run_dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| TrainError::Config(format!("cannot create {}: {e}", dir.display())))?;
        let plan = plan(cfg, inp.train, inp.pad)?;
        let (mut step, mut epoch, mut in_epoch, mut tokens) = (0u64, 0u64, 0u64, 0u64);
        if inp.resume {
            let ck = checkpoint::load(dir)?.ok_or_else(|| {
                TrainError::Config(format!("--resume: {} holds no checkpoint", dir.display()))
            })?;
            let saved: TrainConfig = serde_json::from_str(&ck.config_json)
                .map_err(|e| TrainError::Config(format!("checkpoint config: {e}")))?;
            if &saved != cfg {
                return Err(TrainError::Config(format!(
                    "--resume: the options differ from the checkpoint's ({})",
                    ck.config_json
                )));
            }
            t.set_params(&take(&ck, "lora.params", dir)?)?;
            t.set_moments(&take(&ck, "adam.m", dir)?, &take(&ck, "adam.v", dir)?)?;
            (step, epoch, in_epoch, tokens) = (ck.step, ck.epoch, ck.batch_in_epoch, ck.tokens);
            obs.note(&format!(
                "resumed at step {step} (epoch {epoch}, step {in_epoch} of it)"
            ));
        } else {
            let init = t.layout().init(cfg.seed);
            t.set_params(&init)?;
            let z = vec![0f32; t.layout().n_params];
            t.set_moments(&z, &z)?;
        }
        let log = LossLog::open(dir, inp.resume.then_some(step))?;
        let sum = Summary {
            steps: step,
            first_loss: None,
            last_loss: None,
            first_eval: None,
            last_eval: None,
            tokens,
            tok_per_s: 0.0,
            peak_device_bytes: t.memory_bytes(),
        };
        let mut run = Run {
            cfg: cfg.clone(),
            inp,
            plan,
            step,
            epoch,
            in_epoch,
            tokens,
            tokens_at_start: tokens,
            log,
            sum,
            start: Instant::now(),
            cur: None,
        };
        if !inp.resume && cfg.eval_every > 0 {
            run.eval(t, 0, obs)?;
        }
        Ok(run)
    }

    /// Optimizer steps completed (resumed ones included).
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    /// Optimizer steps the whole run takes.
    pub fn total_steps(&self) -> u64 {
        self.plan.total
    }

    /// The run's options.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.inp.run_dir
    }

    /// One optimizer step with its micro-steps, log line, evaluation and checkpoint when due.
    /// Returns false (doing nothing) when the run has no step left.
    pub fn step(&mut self, t: &mut dyn Backend, obs: &mut dyn Observer) -> Result<bool> {
        if !self.submit_micro(t)? {
            return Ok(false);
        }
        loop {
            self.finish_micro(t, obs)?;
            if self.cur.is_none() || !self.submit_micro(t)? {
                return Ok(true);
            }
        }
    }

    /// Starts the next optimizer step if none is in progress, then submits its next micro-step
    /// without waiting ([`Backend::submit_micro`]). Returns false, submitting nothing, when the
    /// run has no step left. Follow with [`Run::finish_micro`].
    pub fn submit_micro(&mut self, t: &mut dyn Backend) -> Result<bool> {
        if self.cur.is_none() {
            loop {
                if self.step >= self.plan.total || self.epoch as usize >= self.plan.epochs.len() {
                    return Ok(false);
                }
                if self.in_epoch >= self.plan.steps_per_epoch[self.epoch as usize] {
                    (self.epoch, self.in_epoch) = (self.epoch + 1, 0);
                    continue;
                }
                break;
            }
            let per_step = self.cfg.batch * self.cfg.grad_accum;
            let seqs = &self.plan.epochs[self.epoch as usize];
            let first = self.in_epoch as usize * per_step;
            let len = per_step.min(seqs.len() - first);
            let group: Vec<&Sequence> = seqs[first..first + len].iter().collect();
            let n_trained = trained(&group);
            self.cur = Some(Current {
                first,
                len,
                weight: if n_trained > 0 {
                    1.0 / n_trained as f32
                } else {
                    0.0
                },
                submitted: 0,
                finished: 0,
                loss: 0.0,
                t0: Instant::now(),
            });
        }
        let cfg = &self.cfg;
        let cur = self.cur.as_mut().ok_or(TrainError::NoChain)?;
        let seqs = &self.plan.epochs[self.epoch as usize];
        let mi = cur.submitted;
        let a = cur.first + mi * cfg.batch;
        let b = (a + cfg.batch).min(cur.first + cur.len);
        let micro: Vec<&Sequence> = seqs[a..b].iter().collect();
        let r = rows_of(&micro, cfg.batch, cfg.seq_len, self.inp.pad, cur.weight);
        t.submit_micro(&r, micro_seed(cfg.seed, self.step, mi))?;
        cur.submitted += 1;
        Ok(true)
    }

    /// Waits for the micro-step [`Run::submit_micro`] submitted; after the step's last one, runs
    /// the optimizer step, logs it, and evaluates and checkpoints when due.
    pub fn finish_micro(&mut self, t: &mut dyn Backend, obs: &mut dyn Observer) -> Result<()> {
        let loss = t.finish_micro()?;
        let rows = (self.cfg.batch * self.cfg.seq_len) as u64;
        let cur = self.cur.as_mut().ok_or_else(|| {
            TrainError::Config("finish_micro: no optimizer step in progress".into())
        })?;
        cur.loss += loss;
        cur.finished += 1;
        self.tokens += rows;
        if cur.finished < cur.len.div_ceil(self.cfg.batch) {
            return Ok(());
        }
        let cur = self.cur.take().ok_or(TrainError::NoChain)?;
        self.end_step(t, obs, &cur)
    }

    /// The optimizer step after the last micro-step of `cur`.
    fn end_step(
        &mut self,
        t: &mut dyn Backend,
        obs: &mut dyn Observer,
        cur: &Current,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let rows = (cfg.batch * cfg.seq_len) as u64;
        let micro_count = cur.len.div_ceil(cfg.batch) as u64;
        let lr = lr_at(cfg.schedule, cfg.lr, cfg.warmup, self.plan.total, self.step);
        let grad_norm = t.optimizer_step(&AdamWStep {
            lr,
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.adam_eps,
            weight_decay: cfg.weight_decay,
            step: (self.step + 1) as u32,
            max_grad_norm: cfg.max_grad_norm,
            grad_scale: 1.0,
            zero_grads: true,
        })?;
        if !grad_norm.is_finite() {
            return Err(TrainError::NonFinite(format!(
                "gradient norm {grad_norm} at step {}",
                self.step + 1
            )));
        }
        self.step += 1;
        self.in_epoch += 1;
        let (step, loss) = (self.step, cur.loss);
        let dt = cur.t0.elapsed().as_secs_f64();
        let report = StepReport {
            step,
            total_steps: self.plan.total,
            epoch: self.epoch,
            loss,
            lr,
            grad_norm,
            tokens: micro_count * rows,
            tok_per_s: (micro_count * rows) as f64 / dt.max(1e-9),
            elapsed_s: self.start.elapsed().as_secs_f64(),
        };
        self.log.append(&serde_json::json!({
            "step": step, "epoch": self.epoch, "loss": loss, "lr": lr, "grad_norm": grad_norm,
            "tokens": self.tokens, "tok_per_s": report.tok_per_s, "elapsed_s": report.elapsed_s,
        }))?;
        self.sum.first_loss.get_or_insert(loss);
        self.sum.last_loss = Some(loss);
        self.sum.peak_device_bytes = self.sum.peak_device_bytes.max(t.memory_bytes());
        obs.step(&report);
        let (total, eval_every, save_every) = (self.plan.total, cfg.eval_every, cfg.save_every);
        if eval_every > 0 && step % eval_every == 0 && step < total {
            self.eval(t, step, obs)?;
        }
        if save_every > 0 && step % save_every == 0 && step < total {
            self.save(t)?;
        }
        Ok(())
    }

    fn eval(&mut self, t: &mut dyn Backend, step: u64, obs: &mut dyn Observer) -> Result<()> {
        if let Some(ev) = self.inp.eval {
            let l = evaluate(t, &self.cfg, ev, self.inp.pad)?;
            self.log
                .append(&serde_json::json!({"step": step, "eval_loss": l}))?;
            self.sum.first_eval.get_or_insert(l);
            self.sum.last_eval = Some(l);
            obs.eval(step, l);
        }
        Ok(())
    }

    fn save(&self, t: &dyn Backend) -> Result<()> {
        let pos = (self.epoch, self.in_epoch);
        save(t, &self.cfg, &self.inp.run_dir, self.step, pos, self.tokens)
    }

    /// The final evaluation and checkpoint; the run's summary. Errors while an optimizer step
    /// is half done (call it once [`Run::step`] returned false or [`Run::submit_micro`]
    /// submitted nothing).
    pub fn finish(mut self, t: &mut dyn Backend, obs: &mut dyn Observer) -> Result<Summary> {
        if self.cur.is_some() {
            return Err(TrainError::Config(
                "finish: an optimizer step is in progress".into(),
            ));
        }
        let step = self.step;
        self.eval(t, step, obs)?;
        self.save(t)?;
        let secs = self.start.elapsed().as_secs_f64();
        self.sum.steps = step;
        self.sum.tokens = self.tokens;
        self.sum.tok_per_s = (self.tokens - self.tokens_at_start) as f64 / secs.max(1e-9);
        Ok(self.sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(epochs: u64, max_steps: Option<u64>) -> TrainConfig {
        TrainConfig {
            lora: LoraConfig {
                rank: 4,
                alpha: 8.0,
                dropout: 0.0,
                targets: Vec::new(),
            },
            lr: 1e-3,
            weight_decay: 0.0,
            schedule: Schedule::Cosine,
            warmup: 0,
            epochs,
            max_steps,
            batch: 4,
            grad_accum: 1,
            seq_len: 8,
            max_grad_norm: 1.0,
            seed: 3,
            save_every: 0,
            eval_every: 0,
            beta1: 0.9,
            beta2: 0.999,
            adam_eps: 1e-8,
        }
    }

    /// 20 examples that each fill one 8-token sequence: 5 steps of 4 per epoch.
    fn twenty() -> Vec<Example> {
        (0..20u32)
            .map(|i| Example {
                ids: (0..8).map(|k| 10 * i + k).collect(),
                train: vec![true; 8],
            })
            .collect()
    }

    #[test]
    fn max_steps_overrides_epochs_and_goes_through_the_data_as_often_as_needed() {
        let data = twenty();
        let p = plan(&cfg(1, Some(12)), &data, 0).unwrap();
        assert_eq!(p.total, 12);
        assert_eq!(p.steps_per_epoch, vec![5, 5, 5]);
        // each pass is the whole set, reshuffled
        for seqs in &p.epochs {
            let mut firsts: Vec<u32> = seqs.iter().map(|s| s.ids[0]).collect();
            firsts.sort_unstable();
            assert_eq!(firsts, (0..20).map(|i| 10 * i).collect::<Vec<_>>());
        }
        assert_ne!(p.epochs[0][0].ids, p.epochs[1][0].ids);
        // more epochs than the steps need are not planned either, and fewer steps cut the first
        let p = plan(&cfg(4, Some(3)), &data, 0).unwrap();
        assert_eq!((p.total, p.epochs.len()), (3, 1));
        // without max_steps the epochs decide
        let p = plan(&cfg(2, None), &data, 0).unwrap();
        assert_eq!((p.total, p.epochs.len()), (10, 2));
    }

    #[test]
    fn zero_steps_or_epochs_is_a_clear_error() {
        for c in [cfg(1, Some(0)), cfg(0, None)] {
            let Err(e) = plan(&c, &twenty(), 0) else {
                panic!("{c:?} planned a run");
            };
            assert!(e.to_string().contains("nothing to train"), "{e}");
        }
    }
}
