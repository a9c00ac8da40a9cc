//! Draws on the host: the run's sampling parameters with an instance's seed and counter, and
//! the score of a drawn token.

use octoflow_core::Draw;

/// The sampling parameters every draw of a run shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
}

impl Sampling {
    /// Draw number `step` with `seed`.
    pub fn draw(&self, seed: u64, step: u64) -> Draw {
        Draw {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed,
            step,
        }
    }
}

/// `log softmax(logits)[token]` at temperature 1, in f32 (max-subtracted, summed in index
/// order — the order the GPU interpreter's reduction must reproduce only where scores decide,
/// in `best`).
pub fn logprob(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    match logits.get(token as usize) {
        Some(&l) => l - max - sum.ln(),
        None => f32::NEG_INFINITY,
    }
}
