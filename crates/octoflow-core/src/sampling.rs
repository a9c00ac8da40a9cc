//! Sampling: turning a row of logits into the next token, with llama.cpp's parameters and order
//! (penalties → top-k → top-p → min-p → temperature → draw).
//!
//! The random draw uses a counter-based generator ([`uniform`]): the number for step `n` is a hash
//! of `(seed, n)`, so the same seed gives the same text, and a GPU sampler that hashes the same way
//! draws the same numbers without carrying RNG state between kernels.

use std::collections::HashMap;

use crate::mask::TokenMask;

/// Sampling parameters, named and defaulted as llama.cpp's `common_params_sampling`.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Nucleus: keep the smallest set whose probability reaches `top_p`; 1.0 disables.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` × the top probability; 0 disables.
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens; 1.0 disables.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token seen in the window (OpenAI's meaning).
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window (OpenAI's meaning).
    pub frequency_penalty: f32,
    /// Seed of the draw.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Checks ranges; the message names the parameter.
    pub fn validate(&self) -> Result<(), String> {
        let finite = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repeat_penalty", self.repeat_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ];
        if let Some((name, v)) = finite.iter().find(|(_, v)| !v.is_finite()) {
            return Err(format!("{name} must be a finite number, got {v}"));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.repeat_penalty <= 0.0 {
            return Err(format!(
                "repeat_penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        Ok(())
    }
}

/// A uniform number in [0, 1) for draw number `step` of a sequence seeded with `seed`
/// (SplitMix64 finalizer over the pair; 24 random mantissa bits).
pub fn uniform(seed: u64, step: u64) -> f32 {
    let mut z = seed
        ^ step
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 24) as f32
}

/// Index of the largest finite value (first on ties); 0 for an empty or all-NaN row.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// `log softmax(logits)[token]` at temperature 1, in f32: the max subtracted, the sum of
/// `exp(l - max)` taken in index order (the agent VM's token score; the GPU sampler's
/// `logprob_ref`). A token past the row scores `-inf`; a NaN logit makes every score NaN.
pub fn logprob(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
    match logits.get(token as usize) {
        Some(&l) => l - max - sum.ln(),
        None => f32::NEG_INFINITY,
    }
}

/// A sampler for one sequence: the parameters, the recent-token window for penalties, and the
/// draw counter.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    recent: std::collections::VecDeque<u32>,
    step: u64,
}

impl Sampler {
    /// A new sampler; `params` should have been validated.
    pub fn new(params: SamplingParams) -> Self {
        Self {
            params,
            recent: std::collections::VecDeque::new(),
            step: 0,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Index of the next draw (`uniform(seed, step)`).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Counts `n` draws made elsewhere with this sampler's parameters (on the GPU), so the
    /// next CPU draw continues the same sequence.
    pub fn skip(&mut self, n: u64) {
        self.step += n;
    }

    /// Whether the repetition, presence or frequency penalty is on (they need the window of
    /// recent tokens, which only the CPU sampler keeps).
    pub fn penalized(&self) -> bool {
        let p = &self.params;
        p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0
    }

    /// Records a token the model saw (prompt or generated) for the penalty window.
    pub fn accept(&mut self, token: u32) {
        if self.params.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.params.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Chooses the next token from `logits` (one row over the vocabulary). Does not call
    /// [`Sampler::accept`]; the caller does, once the token is final.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let penalised =
            p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if p.temperature <= 0.0 && !penalised {
            self.step += 1;
            return argmax(logits);
        }
        let cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan())
            .map(|(i, &v)| (i as u32, v))
            .collect();
        self.sample_candidates(cands).unwrap_or(0)
    }

    /// Like [`Sampler::sample`], among the tokens `mask` allows only: the others are out of the
    /// race before any filter, so top-k, top-p and min-p see the allowed tokens alone (as
    /// llama.cpp's grammar sampler, which runs first). An allowed token is always returned
    /// while one exists — when no allowed logit beats -inf (NaN or -inf), the lowest allowed
    /// id; `None` only when the mask allows nothing. The GPU's masked sampler
    /// (octoflow-kernels `sample_masked_ref`) takes the same token.
    pub fn sample_masked(&mut self, logits: &[f32], mask: &TokenMask) -> Option<u32> {
        let cands: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .filter(|&(i, v)| !v.is_nan() && mask.allows(i as u32))
            .map(|(i, &v)| (i as u32, v))
            .collect();
        if !cands.iter().any(|c| c.1 > f32::NEG_INFINITY) {
            self.step += 1;
            return mask.first_allowed();
        }
        self.sample_candidates(cands)
    }

    /// Penalties, filters and the draw over `(token, logit)` pairs (no NaN); counts the draw.
    fn sample_candidates(&mut self, mut cands: Vec<(u32, f32)>) -> Option<u32> {
        let step = self.step;
        self.step += 1;
        if cands.is_empty() {
            return None;
        }
        let p = &self.params;
        let penalised =
            p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if penalised {
            self.apply_penalties(&mut cands);
        }
        let p = &self.params;
        if p.temperature <= 0.0 {
            return Some(argmax_pairs(&cands));
        }
        let u = uniform(p.seed, step);
        Some(sample_filtered(cands, p, u))
    }

    fn apply_penalties(&self, cands: &mut [(u32, f32)]) {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &self.recent {
            *counts.entry(t).or_default() += 1;
        }
        let p = &self.params;
        for (tok, logit) in cands.iter_mut() {
            let Some(&n) = counts.get(tok) else { continue };
            if *logit > 0.0 {
                *logit /= p.repeat_penalty;
            } else {
                *logit *= p.repeat_penalty;
            }
            *logit -= n as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }
}

fn argmax_pairs(c: &[(u32, f32)]) -> u32 {
    let mut best = c[0];
    for &x in &c[1..] {
        if x.1 > best.1 {
            best = x;
        }
    }
    best.0
}

/// Applies top-k, top-p, min-p and temperature to non-empty `cands`, then draws with `u` in [0,1).
fn sample_filtered(mut cands: Vec<(u32, f32)>, p: &SamplingParams, u: f32) -> u32 {
    // Sorted by logit, descending; ties by token id so the order is deterministic.
    cands.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if p.top_k > 0 && p.top_k < cands.len() {
        cands.truncate(p.top_k);
    }
    let probs = softmax(cands.iter().map(|c| c.1));
    let mut keep = cands.len();
    if p.top_p < 1.0 {
        let mut cum = 0.0;
        for (i, &pr) in probs.iter().enumerate() {
            cum += pr;
            if cum >= p.top_p {
                keep = i + 1;
                break;
            }
        }
    }
    if p.min_p > 0.0 {
        let floor = probs[0] * p.min_p;
        keep = keep.min(probs.iter().take_while(|&&pr| pr >= floor).count().max(1));
    }
    cands.truncate(keep.max(1));
    let probs = softmax(cands.iter().map(|c| c.1 / p.temperature));
    let mut cum = 0.0;
    for (c, pr) in cands.iter().zip(&probs) {
        cum += pr;
        if u < cum {
            return c.0;
        }
    }
    cands[cands.len() - 1].0
}

/// Softmax of the values (max-subtracted), as f32 probabilities summing to 1.
pub fn softmax(values: impl Iterator<Item = f32> + Clone) -> Vec<f32> {
    let max = values.clone().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = values.map(|v| (v - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// A seed from the clock and the process's hasher keys (for "no seed given": different every
/// run, printed by the commands so a run can be repeated).
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplingParams::default()
        };
        f(&mut p);
        p
    }

    #[test]
    fn temperature_zero_is_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9]), 1);
    }

    #[test]
    fn same_seed_same_tokens_other_seed_other_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.1).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(|p| {
                p.temperature = 1.0;
                p.seed = seed;
            }));
            (0..64).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut s = Sampler::new(params(|p| {
            p.temperature = 5.0;
            p.top_k = 1;
        }));
        for _ in 0..50 {
            assert_eq!(s.sample(&[1.0, 2.0, 1.9, -3.0]), 1);
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus_only() {
        // Probabilities ~ [0.66, 0.24, 0.09, 0.004]: top_p 0.8 keeps the first two.
        let logits = [3.0f32, 2.0, 1.0, -2.0];
        let mut s = Sampler::new(params(|p| {
            p.temperature = 1.0;
            p.top_p = 0.8;
        }));
        for _ in 0..500 {
            assert!(s.sample(&logits) < 2);
        }
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let logits = [3.0f32, 2.9, 0.0, -1.0];
        let mut s = Sampler::new(params(|p| {
            p.temperature = 1.0;
            p.min_p = 0.5;
        }));
        for _ in 0..500 {
            assert!(s.sample(&logits) < 2);
        }
    }

    #[test]
    fn draws_follow_the_distribution() {
        let logits = [0.0f32, (3.0f32).ln()]; // probabilities 0.25 / 0.75
        let mut s = Sampler::new(params(|p| p.temperature = 1.0));
        let ones = (0..20_000).filter(|_| s.sample(&logits) == 1).count();
        let frac = ones as f64 / 20_000.0;
        assert!((frac - 0.75).abs() < 0.02, "fraction {frac}");
    }

    #[test]
    fn repeat_penalty_demotes_seen_tokens() {
        let mut s = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.repeat_penalty = 2.0;
        }));
        s.accept(0);
        // 2.0 / 2 = 1.0 < 1.5
        assert_eq!(s.sample(&[2.0, 1.5]), 1);
        let mut s = Sampler::new(params(|p| {
            p.temperature = 0.0;
            p.frequency_penalty = 0.3;
            p.presence_penalty = 0.1;
        }));
        s.accept(0);
        s.accept(0);
        // 2.0 - 2*0.3 - 0.1 = 1.3 < 1.5
        assert_eq!(s.sample(&[2.0, 1.5]), 1);
    }

    #[test]
    fn uniform_is_in_range_and_spread() {
        let mut sum = 0.0f64;
        for i in 0..10_000 {
            let u = uniform(42, i);
            assert!((0.0..1.0).contains(&u));
            sum += f64::from(u);
        }
        assert!((sum / 10_000.0 - 0.5).abs() < 0.02);
    }

    #[test]
    fn invalid_parameters_are_named() {
        let p = params(|p| p.top_p = 1.5);
        assert!(p.validate().unwrap_err().contains("top_p"));
        let p = params(|p| p.temperature = f32::NAN);
        assert!(p.validate().unwrap_err().contains("temperature"));
    }

    #[test]
    fn nan_logits_are_never_chosen() {
        let mut s = Sampler::new(params(|p| p.temperature = 1.0));
        for _ in 0..100 {
            assert_ne!(s.sample(&[f32::NAN, 0.0, f32::NAN, 0.5]) % 2, 0);
        }
    }
}

#[cfg(test)]
mod masked_tests {
    use super::*;

    /// Logits favouring high ids strongly, so an unmasked draw would take them.
    fn logits(n: usize) -> Vec<f32> {
        (0..n).map(|i| i as f32 * 0.5).collect()
    }

    #[test]
    fn a_masked_draw_takes_only_allowed_tokens() {
        let allowed = [3u32, 17, 40];
        let mask = TokenMask::from_allowed(allowed, 64);
        for temperature in [0.0, 0.7, 1.5] {
            let mut s = Sampler::new(SamplingParams {
                temperature,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed: 7,
                ..SamplingParams::default()
            });
            for _ in 0..200 {
                let t = s.sample_masked(&logits(64), &mask).expect("allowed");
                assert!(allowed.contains(&t), "{t} at temperature {temperature}");
            }
        }
    }

    #[test]
    fn greedy_masked_is_the_best_allowed_token() {
        let mut s = Sampler::new(SamplingParams::greedy());
        let mask = TokenMask::from_allowed([5, 9], 64);
        assert_eq!(s.sample_masked(&logits(64), &mask), Some(9));
    }

    #[test]
    fn nan_logits_still_give_an_allowed_token_and_an_empty_mask_gives_none() {
        let mut s = Sampler::new(SamplingParams::default());
        let mut l = logits(64);
        l[12] = f32::NAN;
        l[13] = f32::NAN;
        let mask = TokenMask::from_allowed([12, 13], 64);
        assert_eq!(s.sample_masked(&l, &mask), Some(12));
        assert_eq!(s.sample_masked(&l, &TokenMask::from_allowed([], 64)), None);
    }

    #[test]
    fn an_all_allowing_mask_draws_what_the_plain_sampler_draws() {
        let p = SamplingParams {
            temperature: 0.9,
            seed: 11,
            ..SamplingParams::default()
        };
        let (mut a, mut b) = (Sampler::new(p.clone()), Sampler::new(p));
        let all = TokenMask::from_allowed(0..64, 64);
        let l: Vec<f32> = (0..64u32).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        for _ in 0..50 {
            assert_eq!(a.sample_masked(&l, &all), Some(b.sample(&l)));
        }
    }
}
