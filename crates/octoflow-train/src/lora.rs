//! LoRA adapters: which projections get one, their shapes, and where each lives in the one flat
//! f32 parameter buffer the trainer keeps on the GPU.
//!
//! A target projection `y = W x` (W `[n_out, n_in]`, frozen, quantized) becomes
//! `y = W x + scale · B (A x)` with `A [rank, n_in]`, `B [n_out, rank]`, `scale = alpha / rank`,
//! A drawn like PEFT's default (`kaiming_uniform(a = sqrt(5))`, i.e. `U(-1/sqrt(n_in),
//! 1/sqrt(n_in))`) and B zero, so training starts from the base model exactly.

use octoflow_model::adapter::{Adapter, LoraTensor};
use octoflow_model::ModelConfig;
use rand::{Rng, SeedableRng};

use crate::error::{Result, TrainError};

pub use octoflow_model::adapter::Target;

/// The adapter hyper-parameters of a run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f32,
    /// Dropout probability on the adapter's input (PEFT's `lora_dropout`), in `[0, 1)`.
    pub dropout: f32,
    pub targets: Vec<Target>,
}

impl LoraConfig {
    /// `alpha / rank`, the factor on `B A x`.
    pub fn scale(&self) -> f32 {
        self.alpha / self.rank as f32
    }

    /// Checks the values a user gave.
    pub fn validate(&self) -> Result<()> {
        if self.rank == 0 || self.rank > 1024 {
            return Err(TrainError::Config(format!(
                "--rank {} is out of range (1..=1024)",
                self.rank
            )));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(TrainError::Config(format!(
                "--dropout {} must be in [0, 1)",
                self.dropout
            )));
        }
        if !self.alpha.is_finite() || self.alpha <= 0.0 {
            return Err(TrainError::Config(format!(
                "--alpha {} must be positive",
                self.alpha
            )));
        }
        if self.targets.is_empty() {
            return Err(TrainError::Config("no LoRA targets given".into()));
        }
        Ok(())
    }
}

/// One adapter: its projection and where its A and B start in the flat parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraEntry {
    pub layer: usize,
    pub target: Target,
    pub n_in: usize,
    pub n_out: usize,
    /// Offset (in f32 values) of `A [rank, n_in]`.
    pub a: usize,
    /// Offset of `B [n_out, rank]`.
    pub b: usize,
}

/// Every adapter of a run, laid out layer by layer, target by target (A then B).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraLayout {
    pub rank: usize,
    pub scale: f32,
    pub entries: Vec<LoraEntry>,
    /// Total f32 values.
    pub n_params: usize,
}

impl LoraLayout {
    /// The layout of `cfg`'s adapters on a model of config `c`.
    pub fn new(cfg: &LoraConfig, c: &ModelConfig) -> Self {
        let mut entries = Vec::new();
        let mut at = 0;
        for layer in 0..c.n_layer {
            for &target in &cfg.targets {
                let (n_in, n_out) = target.dims(c);
                let a = at;
                let b = a + cfg.rank * n_in;
                at = b + n_out * cfg.rank;
                entries.push(LoraEntry {
                    layer,
                    target,
                    n_in,
                    n_out,
                    a,
                    b,
                });
            }
        }
        LoraLayout {
            rank: cfg.rank,
            scale: cfg.scale(),
            entries,
            n_params: at,
        }
    }

    /// Checks that `n` values (of `what`: parameters, moments) fill this layout.
    pub fn check_len(&self, what: &str, n: usize) -> Result<()> {
        if n != self.n_params {
            return Err(TrainError::Config(format!(
                "{what}: {n} values given, the adapters have {}",
                self.n_params
            )));
        }
        Ok(())
    }

    /// The adapter on `target` of `layer`, if the run has one.
    pub fn get(&self, layer: usize, target: Target) -> Option<&LoraEntry> {
        self.entries
            .iter()
            .find(|e| e.layer == layer && e.target == target)
    }

    /// Initial parameters: A uniform in `±1/sqrt(n_in)` (PEFT's default), B zero.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut p = vec![0f32; self.n_params];
        for e in &self.entries {
            let bound = 1.0 / (e.n_in as f32).sqrt();
            for v in &mut p[e.a..e.b] {
                *v = rng.gen_range(-bound..bound);
            }
        }
        p
    }

    /// `(name, [rows, cols], offset)` of every tensor, named like llama.cpp's LoRA GGUF
    /// (`blk.N.attn_q.weight.lora_a` is A `[rank, n_in]`, `.lora_b` is B `[n_out, rank]`).
    pub fn tensors(&self) -> Vec<(String, [usize; 2], usize)> {
        let mut out = Vec::new();
        for e in &self.entries {
            let stem = format!("blk.{}.{}.weight", e.layer, e.target.gguf_stem());
            out.push((format!("{stem}.lora_a"), [self.rank, e.n_in], e.a));
            out.push((format!("{stem}.lora_b"), [e.n_out, self.rank], e.b));
        }
        out
    }
}

impl LoraLayout {
    /// The adapters `params` (laid out by `self`, trained with `alpha`) as an [`Adapter`]
    /// named `name`: what inference, export and merging take.
    pub fn adapter(&self, params: &[f32], alpha: f32, name: &str) -> Result<Adapter> {
        if params.len() != self.n_params {
            return Err(TrainError::Config(format!(
                "adapter has {} values, its layout needs {}",
                params.len(),
                self.n_params
            )));
        }
        let r = self.rank;
        let tensors = self
            .entries
            .iter()
            .map(|e| LoraTensor {
                layer: e.layer,
                target: e.target,
                rank: r,
                n_in: e.n_in,
                n_out: e.n_out,
                a: params[e.a..e.a + r * e.n_in].to_vec(),
                b: params[e.b..e.b + e.n_out * r].to_vec(),
            })
            .collect();
        Ok(Adapter {
            name: name.to_string(),
            alpha,
            tensors,
        })
    }
}
