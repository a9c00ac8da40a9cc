//! Token sampling on the device (shader `sample.comp`): argmax, or llama.cpp's
//! top-k → softmax → top-p → min-p → temperature → draw, choosing the same token as the CPU
//! sampler (octoflow-core `Sampler::sample` without penalties) for the same logits, parameters,
//! seed and step, up to float rounding exactly at a cumulative-probability boundary.
//!
//! All state lives in a device buffer ([`SamplerState`]) so a decode chain can run several steps
//! per submit: the draw counter advances on the GPU.
//!
//! [`Sample::record_rows`] can also write each drawn token's log-probability at temperature 1
//! ([`logprob_ref`]), the score the agent VM's `best` compares: the max and the sum of
//! `exp(l - max)` are accumulated online in a pass the draw makes anyway, so asking for it adds
//! an `exp` per logit and one f32 write per row, no pass over the vocabulary; a dispatch that
//! asks for none (the decode chains) skips the accumulation by a uniform branch.

use octoflow_core::Draw;
use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::argmax::{argmax_ref, check_out, check_rows};
use crate::error::{KernelError, Result};
use crate::shaders;

/// Largest `top_k` the GPU sampler handles (candidates are kept in shared memory, one per
/// invocation of its 256-wide workgroup; `MAX_TOP_K` in `sample.comp`).
pub const MAX_TOP_K: u32 = 256;

/// The sampler's state on the device: 8 u32 words, std430, in this field order (32 bytes).
/// The draw counter (`step`) advances on the GPU by one per sampled token.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplerState {
    /// Low half of the seed.
    pub seed_lo: u32,
    /// High half of the seed.
    pub seed_hi: u32,
    /// Low half of the draw counter.
    pub step_lo: u32,
    /// High half of the draw counter.
    pub step_hi: u32,
    /// `<= 0`: argmax; otherwise the softmax temperature.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; the GPU needs `1..=MAX_TOP_K` (clamped into it).
    pub top_k: u32,
    /// Nucleus threshold; `>= 1` disables.
    pub top_p: f32,
    /// Drop tokens below `min_p` × the top probability; `<= 0` disables.
    pub min_p: f32,
}

impl SamplerState {
    /// The state for draw number `step` of a sequence seeded with `seed`.
    pub fn new(seed: u64, step: u64, temperature: f32, top_k: u32, top_p: f32, min_p: f32) -> Self {
        SamplerState {
            seed_lo: seed as u32,
            seed_hi: (seed >> 32) as u32,
            step_lo: step as u32,
            step_hi: (step >> 32) as u32,
            temperature,
            top_k,
            top_p,
            min_p,
        }
    }

    /// The state for `draw`.
    pub fn from_draw(draw: &Draw) -> Self {
        let d = draw;
        Self::new(d.seed, d.step, d.temperature, d.top_k, d.top_p, d.min_p)
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        u64::from(self.seed_hi) << 32 | u64::from(self.seed_lo)
    }

    /// The draw counter: the number of the next draw.
    pub fn step(&self) -> u64 {
        u64::from(self.step_hi) << 32 | u64::from(self.step_lo)
    }

    /// The buffer contents (`Plain` is sealed in octoflow-vk, so upload these words).
    pub fn to_words(&self) -> [u32; 8] {
        [
            self.seed_lo,
            self.seed_hi,
            self.step_lo,
            self.step_hi,
            self.temperature.to_bits(),
            self.top_k,
            self.top_p.to_bits(),
            self.min_p.to_bits(),
        ]
    }

    /// The state from buffer contents (see [`SamplerState::to_words`]).
    pub fn from_words(w: [u32; 8]) -> Self {
        SamplerState {
            seed_lo: w[0],
            seed_hi: w[1],
            step_lo: w[2],
            step_hi: w[3],
            temperature: f32::from_bits(w[4]),
            top_k: w[5],
            top_p: f32::from_bits(w[6]),
            min_p: f32::from_bits(w[7]),
        }
    }
}

/// Bytes of a [`SamplerState`] in a buffer.
const STATE_BYTES: u64 = 32;

/// The push constant's "no log-probabilities" (`NO_LOGPROB` in `sample.comp`).
const NO_LOGPROB: u32 = u32::MAX;

/// The sampling kernel, built once per device. One workgroup per draw.
pub struct Sample {
    pipeline: Pipeline,
    /// The `MASKED` variant (a grammar's token mask per row), built at its first use.
    masked: std::sync::OnceLock<Pipeline>,
}

/// u32 words of one row in a mask buffer of [`Sample::record_rows_masked`] over `n_vocab`
/// tokens: the row's flag, then one bit per token.
pub fn mask_row_words(n_vocab: u32) -> u32 {
    1 + n_vocab.div_ceil(32)
}

impl Sample {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Sample {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::SAMPLE, 3, 12))?,
            masked: std::sync::OnceLock::new(),
        })
    }

    /// Whether these parameters run on the GPU: temperature <= 0 (argmax), or
    /// 1 <= top_k <= [`MAX_TOP_K`]. (Penalties are not applied on the GPU.)
    pub fn supports(temperature: f32, top_k: u32) -> bool {
        temperature <= 0.0 || (1..=MAX_TOP_K).contains(&top_k)
    }

    /// Records one draw: `out[out_offset] = sample_ref(logits[..n_vocab], state)` (u32) and the
    /// state's step advances by one (on every draw, greedy included, as the CPU `Sampler`'s).
    /// `logits`: `[n_vocab]` f32, `n_vocab >= 1`; `state`: a [`SamplerState`] (32 bytes, read and
    /// written); `out`: u32, at least `out_offset + 1` of them.
    pub fn record(
        &self,
        chain: &mut Chain,
        logits: &BufferSlice,
        n_vocab: u32,
        state: &BufferSlice,
        out: &BufferSlice,
        out_offset: u32,
    ) -> Result<()> {
        self.record_rows(chain, logits, n_vocab, 1, state, out, out_offset, None)
    }

    /// [`Sample::record`] for `n_rows` rows at once: row `r` of `logits` (`[n_rows, n_vocab]`)
    /// is drawn with state `r` (`state` holds `n_rows` [`SamplerState`]s, each advanced) into
    /// `out[out_offset + r]`. One workgroup per row. With `logprobs_at = Some(at)`,
    /// `out[at + r]` also gets the f32 bits of `logprob_ref(row r, token)` (the same buffer, so
    /// the callers that read tokens back read both in one transfer).
    #[allow(clippy::too_many_arguments)]
    pub fn record_rows(
        &self,
        chain: &mut Chain,
        logits: &BufferSlice,
        n_vocab: u32,
        n_rows: u32,
        state: &BufferSlice,
        out: &BufferSlice,
        out_offset: u32,
        logprobs_at: Option<u32>,
    ) -> Result<()> {
        self.check(logits, n_vocab, n_rows, state, out, out_offset, logprobs_at)?;
        chain.dispatch(
            &self.pipeline,
            &[logits.clone(), state.clone(), out.clone()],
            &Push::new()
                .u32(n_vocab)
                .u32(out_offset)
                .u32(logprobs_at.unwrap_or(NO_LOGPROB)),
            [n_rows, 1, 1],
        )?;
        Ok(())
    }

    /// The shape checks of both kernels.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        logits: &BufferSlice,
        n_vocab: u32,
        n_rows: u32,
        state: &BufferSlice,
        out: &BufferSlice,
        out_offset: u32,
        logprobs_at: Option<u32>,
    ) -> Result<()> {
        check_rows("sample", logits, n_vocab, n_rows)?;
        check_out("sample", out, out_offset, n_rows)?;
        if let Some(at) = logprobs_at {
            if at == NO_LOGPROB {
                let detail = format!("log-probabilities at word {at}, the reserved 'none'");
                return Err(KernelError::Shape {
                    op: "sample",
                    detail,
                });
            }
            check_out("sample", out, at, n_rows)?;
        }
        if state.size < STATE_BYTES * u64::from(n_rows) {
            let detail = format!(
                "state ({}) holds {} bytes, {n_rows} SamplerStates need {}",
                state.buffer.name(),
                state.size,
                STATE_BYTES * u64::from(n_rows)
            );
            return Err(KernelError::Shape {
                op: "sample",
                detail,
            });
        }
        Ok(())
    }

    /// [`Sample::record_rows`] under a grammar: row `r` draws only tokens its mask allows
    /// ([`sample_masked_ref`]). `mask`: `[n_rows, mask_row_words(n_vocab)]` u32, row `r` = a
    /// flag word (0: unconstrained, its bits are not read) then bit `i % 32` of word
    /// `1 + i / 32` per token `i` (set: allowed; octoflow-core's `TokenMask` words). The
    /// log-probabilities are the model's, over every token.
    #[allow(clippy::too_many_arguments)]
    pub fn record_rows_masked(
        &self,
        chain: &mut Chain,
        logits: &BufferSlice,
        n_vocab: u32,
        n_rows: u32,
        state: &BufferSlice,
        out: &BufferSlice,
        out_offset: u32,
        logprobs_at: Option<u32>,
        mask: &BufferSlice,
    ) -> Result<()> {
        // The shapes shared with the unmasked kernel are checked by recording nothing.
        self.check(logits, n_vocab, n_rows, state, out, out_offset, logprobs_at)?;
        let words = mask_row_words(n_vocab);
        if mask.size < 4 * u64::from(words) * u64::from(n_rows) {
            let detail = format!(
                "mask ({}) holds {} bytes, {n_rows} rows of {words} words need {}",
                mask.buffer.name(),
                mask.size,
                4 * u64::from(words) * u64::from(n_rows)
            );
            return Err(KernelError::Shape {
                op: "sample_masked",
                detail,
            });
        }
        let pipeline = match self.masked.get() {
            Some(p) => p,
            None => {
                let p = Pipeline::new(
                    chain.context(),
                    &PipelineDesc::new(shaders::SAMPLE_MASKED, 4, 16),
                )?;
                self.masked.get_or_init(|| p)
            }
        };
        chain.dispatch(
            pipeline,
            &[logits.clone(), state.clone(), out.clone(), mask.clone()],
            &Push::new()
                .u32(n_vocab)
                .u32(out_offset)
                .u32(logprobs_at.unwrap_or(NO_LOGPROB))
                .u32(words),
            [n_rows, 1, 1],
        )?;
        Ok(())
    }
}

/// CPU reference of the draw's random number: the CPU sampler's own `uniform` (octoflow-core),
/// the SplitMix64 finalizer over `(seed, step)`, top 24 bits as a number in [0, 1).
pub fn uniform_ref(seed: u64, step: u64) -> f32 {
    octoflow_core::sampling::uniform(seed, step)
}

/// CPU reference of the log-probability [`Sample::record_rows`] writes: octoflow-core's
/// `logprob`, `log softmax(logits)[token]` at temperature 1 whatever the draw's parameters
/// (the GPU sums `exp(l - max)` in another order, so the two agree to a relative bound, not
/// bit for bit).
pub fn logprob_ref(logits: &[f32], token: u32) -> f32 {
    octoflow_core::sampling::logprob(logits, token)
}

/// Softmax terms `exp(v - v[0])` of values sorted descending, and their sequential sum.
fn exps(values: impl Iterator<Item = f32>) -> (Vec<f32>, f32) {
    let values: Vec<f32> = values.collect();
    let max = values.first().copied().unwrap_or(0.0);
    let e: Vec<f32> = values.iter().map(|v| (v - max).exp()).collect();
    let sum = e.iter().sum();
    (e, sum)
}

/// CPU reference of one draw (the state's step is the draw number; the caller advances it).
///
/// * `temperature <= 0`: [`argmax_ref`].
/// * Otherwise the candidates are the non-NaN logits, sorted by value descending (f32 total
///   order, so +0.0 before -0.0), ties by token id ascending; none: token 0. Keep the first
///   `min(top_k, len)` (`top_k` clamped to `1..=MAX_TOP_K`); `p` = their softmax; top-p keeps
///   the shortest prefix whose running sum of `p` reaches `top_p` (if `top_p < 1`); min-p keeps
///   those with `p >= p[0] * min_p` (if `min_p > 0`, at least one); then softmax of
///   `value / temperature` over the kept, and the first token whose running probability exceeds
///   `u = uniform_ref(seed, step)` (the last kept if rounding leaves none).
pub fn sample_ref(logits: &[f32], state: &SamplerState) -> u32 {
    let s = state;
    if s.temperature <= 0.0 {
        return argmax_ref(logits);
    }
    let mut cands: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if cands.is_empty() {
        return 0;
    }
    cands.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    cands.truncate(s.top_k.clamp(1, MAX_TOP_K) as usize);
    let (e1, sum1) = exps(cands.iter().map(|c| c.1));
    let probs: Vec<f32> = e1.iter().map(|e| e / sum1).collect();
    let mut keep = cands.len();
    if s.top_p < 1.0 {
        let mut cum = 0.0f32;
        if let Some(i) = probs.iter().position(|p| {
            cum += p;
            cum >= s.top_p
        }) {
            keep = i + 1;
        }
    }
    if s.min_p > 0.0 {
        let floor = probs[0] * s.min_p;
        let above = probs.iter().take_while(|&&p| p >= floor).count();
        keep = keep.min(above.max(1));
    }
    cands.truncate(keep.max(1));
    let (e2, sum2) = exps(cands.iter().map(|c| c.1 / s.temperature));
    let u = uniform_ref(s.seed(), s.step());
    let mut cum = 0.0f32;
    for (c, e) in cands.iter().zip(&e2) {
        cum += e / sum2;
        if u < cum {
            return c.0;
        }
    }
    cands[cands.len() - 1].0
}

/// CPU reference of a masked draw ([`Sample::record_rows_masked`]): `mask` is the row's
/// token bits (`None`: unconstrained, [`sample_ref`]). Tokens the mask excludes are NaN logits
/// for [`sample_ref`]; when no allowed logit beats -inf, the lowest allowed id (0 if none).
/// The same token as octoflow-core's `Sampler::sample_masked`.
pub fn sample_masked_ref(logits: &[f32], state: &SamplerState, mask: Option<&[u32]>) -> u32 {
    let Some(mask) = mask else {
        return sample_ref(logits, state);
    };
    let allowed = |i: usize| mask.get(i / 32).is_some_and(|w| w >> (i % 32) & 1 == 1);
    let live = logits
        .iter()
        .enumerate()
        .any(|(i, &v)| allowed(i) && v > f32::NEG_INFINITY);
    if !live {
        return (0..logits.len()).find(|&i| allowed(i)).unwrap_or(0) as u32;
    }
    let masked: Vec<f32> = logits
        .iter()
        .enumerate()
        .map(|(i, &v)| if allowed(i) { v } else { f32::NAN })
        .collect();
    sample_ref(&masked, state)
}

#[cfg(test)]
#[path = "sample_tests.rs"]
mod tests;
