//! What every forward path offers — the CPU reference [`crate::Session`] and the Vulkan
//! [`crate::gpu::GpuSession`] — so generation, perplexity and the agreement tests are written
//! once and run on either.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::forward::Logits;
use octoflow_core::{Draw, Finish};

/// What one run of decode steps on the device produced ([`Forward::decode_steps`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steps {
    /// Sampled tokens in order; all but the last were fed to the model.
    pub tokens: Vec<u32>,
    /// Why the device stopped before running every step (an end-of-generation token, the last
    /// of `tokens`; the token limit; a full context), if it did.
    pub stop: Option<Finish>,
}

/// One sequence being run through a model on some device.
pub trait Forward {
    /// The model's hyper-parameters.
    fn config(&self) -> &ModelConfig;

    /// Positions processed so far (the position of the next token).
    fn n_past(&self) -> usize;

    /// Positions the session can hold.
    fn n_ctx(&self) -> usize;

    /// Forgets every position from `len` on (a no-op if fewer are cached).
    fn truncate(&mut self, len: usize);

    /// Runs `tokens` at positions `start_pos..`, forgetting whatever was cached from
    /// `start_pos` on, and returns the requested logits (`[n, n_vocab]`, row-major).
    fn forward(&mut self, tokens: &[u32], start_pos: usize, logits: Logits) -> Result<Vec<f32>>;

    /// Runs `tokens` after the cached positions, in chunks of at most `chunk` tokens, and
    /// returns the logits of the last one (`[n_vocab]`).
    fn prefill(&mut self, tokens: &[u32], chunk: usize) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        let chunk = chunk.max(1);
        let n_chunks = tokens.len().div_ceil(chunk);
        let mut last = Vec::new();
        for (i, part) in tokens.chunks(chunk).enumerate() {
            let want = if i + 1 == n_chunks {
                Logits::Last
            } else {
                Logits::None
            };
            last = self.forward(part, self.n_past(), want)?;
        }
        Ok(last)
    }

    /// Runs one token after the cached positions and returns its logits (`[n_vocab]`).
    fn decode(&mut self, token: u32) -> Result<Vec<f32>> {
        self.forward(&[token], self.n_past(), Logits::Last)
    }

    /// Whether [`Forward::decode_steps`] can sample with `draw` on the device.
    fn device_samples(&self, draw: &Draw) -> bool {
        let _ = draw;
        false
    }

    /// Feeds `token` and runs several decode steps with sampling on the device, without the
    /// CPU between tokens ([`crate::gpu::GpuSession::decode_steps`]), stopping at a token of
    /// `eog`, after `max_tokens` tokens or at a full context. Only where
    /// [`Forward::device_samples`] holds for `draw`; elsewhere decode token by token.
    fn decode_steps(
        &mut self,
        token: u32,
        draw: &Draw,
        max_tokens: usize,
        eog: &[u32],
    ) -> Result<Steps> {
        let _ = (token, max_tokens, eog);
        Err(ModelError::DeviceSampling(format!(
            "this forward path has no multi-step decode (temperature {}, top_k {})",
            draw.temperature, draw.top_k
        )))
    }
}

/// The checks every forward path makes before running a batch.
pub(crate) fn check_batch(
    c: &ModelConfig,
    tokens: &[u32],
    start_pos: usize,
    cached: usize,
    n_ctx: usize,
) -> Result<()> {
    if tokens.is_empty() {
        return Err(ModelError::EmptyBatch);
    }
    if start_pos > cached {
        return Err(ModelError::StartPastCache { start_pos, cached });
    }
    let needed = start_pos + tokens.len();
    if needed > n_ctx {
        return Err(ModelError::ContextOverflow { needed, n_ctx });
    }
    if let Some((index, &id)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &id)| id as usize >= c.n_vocab)
    {
        return Err(ModelError::TokenOutOfRange {
            id,
            index,
            n_vocab: c.n_vocab,
        });
    }
    Ok(())
}
