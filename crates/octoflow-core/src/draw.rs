//! One token draw as a device sampler takes it: the CPU sampler's parameters without the
//! penalties (they need the window of recent tokens, which only the CPU keeps) and the draw
//! counter. Whether a device can take a given draw is the backend's business
//! (`Forward::device_samples`, `BatchForward::device_samples` in octoflow-model).

use crate::mask::TokenMask;
use crate::sampling::{Sampler, SamplingParams};

/// Parameters and counter of one draw (a multi-step device chain advances `step` itself).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// `<= 0`: greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: u32,
    /// Nucleus threshold; 1.0 disables.
    pub top_p: f32,
    /// Drop tokens below `min_p` × the top probability; 0 disables.
    pub min_p: f32,
    /// Seed of the draw.
    pub seed: u64,
    /// Index of the draw (the CPU sampler's counter).
    pub step: u64,
}

impl Draw {
    /// Draw number `step` by argmax.
    pub const fn greedy(step: u64) -> Self {
        Draw {
            temperature: 0.0,
            top_k: 1,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
            step,
        }
    }

    /// The next draw of `sampler`, or `None` when it applies penalties (which a draw cannot
    /// carry).
    pub fn from_sampler(sampler: &Sampler) -> Option<Self> {
        if sampler.penalized() {
            return None;
        }
        let p = sampler.params();
        Some(Draw {
            temperature: p.temperature,
            top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
            top_p: p.top_p,
            min_p: p.min_p,
            seed: p.seed,
            step: sampler.step(),
        })
    }

    /// Whether the draw is an argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// The token this draw gives for `logits` (`[n_vocab]`), by the CPU sampler: what every
    /// device sampler must reproduce.
    pub fn sample_cpu(&self, logits: &[f32]) -> u32 {
        self.cpu_sampler().sample(logits)
    }

    /// The token this draw gives for `logits` among those `mask` allows, by the CPU sampler
    /// (`Sampler::sample_masked`; 0 when the mask allows nothing).
    pub fn sample_cpu_masked(&self, logits: &[f32], mask: &TokenMask) -> u32 {
        self.cpu_sampler().sample_masked(logits, mask).unwrap_or(0)
    }

    /// The CPU sampler at this draw's counter.
    fn cpu_sampler(&self) -> Sampler {
        let mut sampler = Sampler::new(SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k as usize,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: self.seed,
            ..SamplingParams::default()
        });
        sampler.skip(self.step);
        sampler
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_penalized_sampler_has_no_draw() {
        let s = Sampler::new(SamplingParams {
            repeat_penalty: 1.1,
            ..SamplingParams::default()
        });
        assert_eq!(Draw::from_sampler(&s), None);
    }

    #[test]
    fn a_draw_gives_its_samplers_token_at_every_counter() {
        let params = SamplingParams {
            temperature: 0.9,
            top_k: 50,
            top_p: 0.9,
            min_p: 0.01,
            seed: 0x5eed_1234_abcd,
            ..SamplingParams::default()
        };
        let logits: Vec<f32> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 20) as f32 / 700.0 - 3.0)
            .collect();
        let mut sampler = Sampler::new(params);
        for _ in 0..64 {
            let draw = Draw::from_sampler(&sampler).expect("no penalties");
            assert_eq!(draw.sample_cpu(&logits), sampler.sample(&logits));
        }
    }
}
