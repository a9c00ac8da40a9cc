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

/// A token's score: `log softmax(logits)[token]` at temperature 1 (one function for the host,
/// the CPU engine and the GPU sampler's reference).
pub use octoflow_core::sampling::logprob;
