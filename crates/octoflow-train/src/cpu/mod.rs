//! The training step on the CPU (`octoflow train --device cpu`): the same forward, loss and
//! backward as the GPU's chains (`gpu/`), on every core through rayon, with the frozen
//! matrices dequantized to f32 once and the products done by a cache-blocked f32 GEMM.
//!
//! A micro-step keeps every layer's activations when they fit in [`ACTS_BUDGET`] and
//! otherwise, as the GPU step does, keeps only the residual stream entering each layer and
//! recomputes a layer's activations from it during the backward. Adapters, gradients and
//! AdamW moments live in the flat layout of [`LoraLayout`] (the GPU's), so checkpoints,
//! resume and export do not depend on where a run trained.

mod adapters;
mod attention;
mod gemm;
mod head;
mod layer;
mod ops;
mod weights;

use std::sync::Arc;

use rayon::prelude::*;

use octoflow_kernels::{adamw_ref, AdamWStep};
use octoflow_model::{Model, ModelConfig};

use crate::backend::Backend;
use crate::error::{Result, TrainError};
use crate::gpu::{Rows, TrainerOptions};
use crate::lora::{LoraLayout, Target};

use layer::Acts;
use weights::Base;

/// Activation bytes a micro-step may keep for its backward; past it, layers are recomputed.
const ACTS_BUDGET: u64 = 2 << 30;

/// A LoRA trainer on the CPU over a frozen model.
pub struct CpuTrainer {
    base: Arc<Base>,
    c: ModelConfig,
    layout: LoraLayout,
    dropout: f32,
    batch: usize,
    seq_len: usize,
    /// `batch × seq_len`.
    rows: usize,
    params: Vec<f32>,
    grads: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
    /// Every layer's activations are kept through the backward (else recomputed).
    keep_acts: bool,
    /// The loss of a micro-step submitted and not yet finished.
    pending: Option<f64>,
    /// Activation bytes of the largest micro-step so far.
    peak_acts: u64,
}

impl CpuTrainer {
    /// Dequantizes `model`'s matrices and sets up the adapters of `opts` (initialized as
    /// [`LoraLayout::init`] with seed 0; a run sets its own).
    pub fn new(model: &Model, opts: &TrainerOptions) -> Result<Self> {
        opts.lora.validate()?;
        if opts.batch == 0 || opts.seq_len < 2 {
            return Err(TrainError::Config(format!(
                "batch {} × seq-len {}: need at least one sequence of two tokens",
                opts.batch, opts.seq_len
            )));
        }
        let c = model.config.clone();
        let base = Arc::new(Base::new(model)?);
        let layout = LoraLayout::new(&opts.lora, &c);
        let rows = opts.batch * opts.seq_len;
        let n = layout.n_params;
        let mut t = CpuTrainer {
            base,
            layout,
            dropout: opts.lora.dropout,
            batch: opts.batch,
            seq_len: opts.seq_len,
            rows,
            params: Vec::new(),
            grads: vec![0.0; n],
            m: vec![0.0; n],
            v: vec![0.0; n],
            keep_acts: false,
            pending: None,
            peak_acts: 0,
            c,
        };
        t.params = t.layout.init(0);
        t.keep_acts = t.c.n_layer as u64 * t.layer_act_bytes() <= ACTS_BUDGET;
        Ok(t)
    }

    /// An upper bound of one layer's activation bytes at this trainer's shape.
    fn layer_act_bytes(&self) -> u64 {
        let c = &self.c;
        let (d, ff, t) = (c.n_embd, c.n_ff, self.rows);
        let per_row = 5 * d
            + 2 * (c.q_dim() + c.k_dim())
            + c.v_dim()
            + c.n_head * c.head_dim_v
            + 3 * ff
            + Target::ALL.len() * self.layout.rank;
        let probs = self.batch * c.n_head * self.seq_len * self.seq_len;
        4 * (t * per_row + probs) as u64
    }

    /// Threads the step runs on (rayon's pool: every core, or `RAYON_NUM_THREADS`).
    pub fn threads(&self) -> usize {
        rayon::current_num_threads()
    }

    /// Rows per micro-batch (`batch × seq_len`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Whether micro-steps keep every layer's activations (else they recompute them).
    pub fn keeps_activations(&self) -> bool {
        self.keep_acts
    }

    /// Keep every layer's activations through the backward (`true`: faster) or recompute
    /// each layer's from its saved input (`false`: less memory). [`CpuTrainer::new`] keeps
    /// them when they fit in 2 GiB.
    pub fn set_keep_activations(&mut self, keep: bool) {
        self.keep_acts = keep;
    }

    /// `x0 = token_embd[ids] · embedding_scale`.
    fn embed(&self, r: &Rows) -> Result<Vec<f32>> {
        let d = self.c.n_embd;
        let scale = self.c.embedding_scale;
        let mut x = vec![0f32; self.rows * d];
        x.par_chunks_mut(d)
            .zip(r.ids.par_iter())
            .try_for_each(|(row, &id)| -> Result<()> {
                self.base.token_embd.dequantize_rows(id as usize, row)?;
                row.iter_mut().for_each(|v| *v *= scale);
                Ok(())
            })?;
        Ok(x)
    }

    /// Forward, loss and (with `train`) backward of one micro-batch; the weighted loss sum.
    fn step(&mut self, r: &Rows, seed: u32, train: bool) -> Result<f64> {
        r.check(self.rows, self.c.n_vocab)?;
        let n_layer = self.c.n_layer;
        let keep = train && self.keep_acts;
        let mut xs = Vec::with_capacity(n_layer + 1);
        xs.push(self.embed(r)?);
        let mut acts: Vec<Acts> = Vec::new();
        let mut bytes = 0;
        for il in 0..n_layer {
            let (out, a) = self.layer_forward(il, &xs[il], r, train.then_some(seed));
            if keep {
                bytes += a.bytes();
                acts.push(a);
            } else {
                bytes = bytes.max(a.bytes());
            }
            xs.push(out);
        }
        let (loss, dx) = self.head(&xs[n_layer], r, train)?;
        self.peak_acts = self
            .peak_acts
            .max(bytes + 4 * xs.iter().map(|x| x.len() as u64).sum::<u64>());
        let Some(mut dx) = dx else {
            return Ok(loss);
        };
        for il in (0..n_layer).rev() {
            let a = match acts.pop() {
                Some(a) => a,
                None => self.layer_forward(il, &xs[il], r, Some(seed)).1,
            };
            self.layer_backward(il, &xs[il], &a, &mut dx, r, seed);
        }
        if let Some(i) = self.grads.iter().position(|g| !g.is_finite()) {
            return Err(TrainError::NonFinite(format!(
                "gradient {i} is {} after the backward",
                self.grads[i]
            )));
        }
        Ok(loss)
    }
}

impl Backend for CpuTrainer {
    fn layout(&self) -> &LoraLayout {
        &self.layout
    }

    fn set_params(&mut self, p: &[f32]) -> Result<()> {
        self.layout.check_len("parameters", p.len())?;
        self.params.copy_from_slice(p);
        Ok(())
    }

    fn params(&self) -> Result<Vec<f32>> {
        Ok(self.params.clone())
    }

    fn grads(&self) -> Result<Vec<f32>> {
        Ok(self.grads.clone())
    }

    fn moments(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        Ok((self.m.clone(), self.v.clone()))
    }

    fn set_moments(&mut self, m: &[f32], v: &[f32]) -> Result<()> {
        self.layout.check_len("first moments", m.len())?;
        self.layout.check_len("second moments", v.len())?;
        self.m.copy_from_slice(m);
        self.v.copy_from_slice(v);
        Ok(())
    }

    fn submit_micro(&mut self, r: &Rows, seed: u32) -> Result<()> {
        if self.pending.is_some() {
            return Err(TrainError::Config(
                "submit_micro: the previous micro-step was not finished".into(),
            ));
        }
        self.pending = Some(self.step(r, seed, true)?);
        Ok(())
    }

    fn finish_micro(&mut self) -> Result<f64> {
        self.pending
            .take()
            .ok_or_else(|| TrainError::Config("finish_micro: no micro-step was submitted".into()))
    }

    fn eval(&mut self, r: &Rows) -> Result<f64> {
        self.step(r, 0, false)
    }

    fn optimizer_step(&mut self, step: &AdamWStep) -> Result<f32> {
        if step.step == 0 {
            return Err(TrainError::Config("the optimizer step is 1-based".into()));
        }
        // Σ g² rounded to f32 first, as the GPU's optimizer reads it
        let ss: f64 = self
            .grads
            .par_iter()
            .map(|&g| f64::from(g) * f64::from(g))
            .sum();
        let ss = f64::from(ss as f32);
        let step = AdamWStep {
            zero_grads: true,
            ..*step
        };
        adamw_ref(
            &mut self.params,
            &mut self.grads,
            &mut self.m,
            &mut self.v,
            ss,
            &step,
        );
        Ok((ss as f32).sqrt())
    }

    fn memory_bytes(&self) -> u64 {
        self.base.bytes() + 16 * self.layout.n_params as u64 + self.peak_acts
    }
}
