//! Negative log-likelihood of a token sequence: the quantity llama.cpp's perplexity reports.

use crate::backend::Forward;
use crate::error::{ModelError, Result};
use crate::forward::Logits;
use crate::model::Model;
use crate::ops::log_sum_exp;

/// Tokens per forward pass when scoring (bounds the `[chunk, n_vocab]` logits buffer).
const NLL_CHUNK: usize = 128;

/// Mean negative log-likelihood in nats per token: `-mean(log p(tokens[i] | tokens[..i]))`
/// over `i = 1..tokens.len()` (every position after the first is scored).
///
/// `tokens` are used as given: prepend BOS first where the model adds one. Perplexity is
/// `exp` of the result.
pub fn mean_nll(model: &Model, tokens: &[u32]) -> Result<f64> {
    let nlls = token_nlls(model, tokens)?;
    Ok(nlls.iter().sum::<f64>() / nlls.len() as f64)
}

/// The negative log-likelihood of each of `tokens[1..]` given the tokens before it.
pub fn token_nlls(model: &Model, tokens: &[u32]) -> Result<Vec<f64>> {
    token_nlls_with(&mut model.session(tokens.len()), tokens)
}

/// [`mean_nll`] on any forward path (a fresh session holding at least `tokens.len()` positions).
pub fn mean_nll_with(session: &mut dyn Forward, tokens: &[u32]) -> Result<f64> {
    let nlls = token_nlls_with(session, tokens)?;
    Ok(nlls.iter().sum::<f64>() / nlls.len() as f64)
}

/// [`token_nlls`] on any forward path.
pub fn token_nlls_with(session: &mut dyn Forward, tokens: &[u32]) -> Result<Vec<f64>> {
    if tokens.len() < 2 {
        return Err(ModelError::EmptyBatch);
    }
    let n_vocab = session.config().n_vocab;
    let mut nlls = Vec::with_capacity(tokens.len() - 1);
    for start in (0..tokens.len()).step_by(NLL_CHUNK) {
        let end = (start + NLL_CHUNK).min(tokens.len());
        let logits = session.forward(&tokens[start..end], start, Logits::All)?;
        for (i, row) in logits.chunks_exact(n_vocab).enumerate() {
            if let Some(&next) = tokens.get(start + i + 1) {
                nlls.push(log_sum_exp(row) - f64::from(row[next as usize]));
            }
        }
    }
    Ok(nlls)
}
