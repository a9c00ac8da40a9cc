//! What the training loop needs from the engine that runs a step: the GPU's dispatch chains
//! ([`crate::Trainer`]) or the multithreaded CPU step ([`crate::CpuTrainer`]). Both keep the
//! adapters, gradients and AdamW moments in the flat layout of [`LoraLayout`], so checkpoints
//! and exports do not depend on where a run trained.

use octoflow_kernels::AdamWStep;

use crate::error::Result;
use crate::gpu::Rows;
use crate::lora::LoraLayout;

/// A training step engine over one frozen base model.
pub trait Backend {
    /// The adapters' layout.
    fn layout(&self) -> &LoraLayout;
    /// Replaces the adapters' parameters (`[layout.n_params]`).
    fn set_params(&mut self, p: &[f32]) -> Result<()>;
    /// The adapters' parameters.
    fn params(&self) -> Result<Vec<f32>>;
    /// The gradients accumulated since the last optimizer step.
    fn grads(&self) -> Result<Vec<f32>>;
    /// AdamW's first and second moments.
    fn moments(&self) -> Result<(Vec<f32>, Vec<f32>)>;
    /// Restores AdamW's moments (resume).
    fn set_moments(&mut self, m: &[f32], v: &[f32]) -> Result<()>;
    /// Starts the forward and backward of one micro-batch (gradients accumulate); `seed`
    /// drives the dropout masks. An engine that cannot overlap work may do it all here.
    fn submit_micro(&mut self, r: &Rows, seed: u32) -> Result<()>;
    /// Waits for the micro-step [`Backend::submit_micro`] started; its weighted loss sum
    /// (Σ weight × token loss).
    fn finish_micro(&mut self) -> Result<f64>;
    /// The weighted loss sum of a micro-batch without touching the gradients (no dropout).
    fn eval(&mut self, r: &Rows) -> Result<f64>;
    /// One AdamW step over the accumulated gradients (which it zeroes); the global gradient
    /// norm before clipping.
    fn optimizer_step(&mut self, step: &AdamWStep) -> Result<f32>;
    /// Bytes the trainer's process holds where the step runs (device memory on the GPU; the
    /// dequantized weights and the trainer's buffers on the CPU).
    fn memory_bytes(&self) -> u64;

    /// Forward and backward of one micro-batch; the weighted loss sum.
    fn micro_step(&mut self, r: &Rows, seed: u32) -> Result<f64> {
        self.submit_micro(r, seed)?;
        self.finish_micro()
    }
}
