//! The loop over one session (`octoflow run`'s one-shot and chat modes): prefill the prompt,
//! then sample, stream and stop, on the device's multi-step chains or token by token.

use std::io::Write;
use std::time::Instant;

use octoflow_core::{Draw, Finish, Sampler};
use octoflow_model::Forward;
use octoflow_text::Tokenizer;

use crate::choice::{device_eog, Choice, Limits, Release};
use crate::error::GenerateError;
use crate::prompt::{check_prompt, PREFILL_CHUNK};
use crate::shift::ContextShift;

/// Counts and timings of one generation.
#[derive(Debug, Clone)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub prompt_secs: f64,
    pub generated: usize,
    pub gen_secs: f64,
    pub finish: Finish,
    /// Context shifts made (with a [`ContextShift`]).
    pub shifts: usize,
}

/// Feeds `prompt` (appended after what the session already holds) and streams the reply to `out`.
/// Returns the generated token ids (the last one included, not yet fed to the session: a chat
/// turn that follows starts by feeding it) and the statistics.
///
/// Where the session samples the sampler's draws on the device, tokens come back in bursts and
/// the CPU only streams them (a burst the device stopped ends the choice for the device's
/// reason unless the CPU found one earlier); otherwise each step's logits come back and the
/// CPU samples.
///
/// With `shift` (whose `held` is what the session holds), a prompt that does not fit and a
/// context that fills are shifted ([`ContextShift`]) instead of failing and ending the reply.
pub fn generate(
    session: &mut dyn Forward,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    limits: &Limits,
    mut shift: Option<&mut ContextShift>,
    out: &mut dyn Write,
) -> Result<(Vec<u32>, Stats), GenerateError> {
    let n_ctx = session.n_ctx();
    let shifts_before = shift.as_ref().map_or(0, |s| s.shifts);
    let fed = match shift.as_deref_mut() {
        Some(s) if !prompt.is_empty() => s.fit_prompt(session, prompt),
        _ => prompt.to_vec(),
    };
    check_prompt(&fed, session.n_past(), n_ctx, session.config().n_vocab)?;
    // the sampler sees the whole prompt, also where a shift feeds only its end
    for &t in prompt {
        sampler.accept(t);
    }
    let prompt = fed;
    let t0 = Instant::now();
    let logits = session.prefill(&prompt, PREFILL_CHUNK)?;
    if let Some(s) = shift.as_deref_mut() {
        s.held.extend_from_slice(&prompt);
    }
    let prompt_secs = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    // Shifting, the context never ends the choice: the loop makes room before each feed.
    let choice_ctx = if shift.is_some() { usize::MAX } else { n_ctx };
    let mut reply = Reply {
        choice: Choice::new(tokenizer, limits, session.n_past(), choice_ctx),
        tokens: Vec::new(),
        out,
    };
    let mut token = sampler.sample(&logits);
    let mut finish = reply.push(token, sampler)?;
    let eog = device_eog(tokenizer, limits.ignore_eos);
    while finish.is_none() {
        if let Some(s) = shift.as_deref_mut() {
            s.make_room(session, 1)?;
        }
        let Some(draw) = Draw::from_sampler(sampler).filter(|d| session.device_samples(d)) else {
            let logits = session.decode(token)?;
            if let Some(s) = shift.as_deref_mut() {
                s.held.push(token);
            }
            token = sampler.sample(&logits);
            finish = reply.push(token, sampler)?;
            continue;
        };
        let max_tokens = limits
            .max_tokens
            .map_or(usize::MAX, |n| n - reply.tokens.len());
        let steps = session.decode_steps(token, &draw, max_tokens, &eog)?;
        let last = *steps.tokens.last().ok_or(GenerateError::NoDecodeStep)?;
        let base = session.n_past() - steps.tokens.len();
        sampler.skip(steps.tokens.len() as u64);
        for (i, &t) in steps.tokens.iter().enumerate() {
            finish = reply.push(t, sampler)?;
            if finish.is_some() {
                // The device may have run past a stop the CPU found (a stop string): the cache
                // keeps only what this reply fed, i.e. every token before `t`.
                session.truncate(base + i + 1);
                break;
            }
        }
        if let Some(s) = shift.as_deref_mut() {
            // what was fed: the pending token, then every step's token but the last
            s.held.push(token);
            s.held.extend_from_slice(&steps.tokens);
            s.held.truncate(session.n_past());
        }
        match (finish, steps.stop) {
            (None, Some(Finish::Context)) if shift.is_some() => {}
            (None, Some(stop)) => {
                let end = reply.choice.end(stop);
                finish = reply.write(end)?;
            }
            _ => {}
        }
        token = last;
    }
    let stats = Stats {
        prompt_tokens: prompt.len(),
        prompt_secs,
        generated: reply.tokens.len(),
        gen_secs: t1.elapsed().as_secs_f64(),
        finish: finish.unwrap_or(Finish::Length),
        shifts: shift.map_or(0, |s| s.shifts - shifts_before),
    };
    Ok((reply.tokens, stats))
}

/// The reply streamed so far.
struct Reply<'a, 't> {
    choice: Choice<'t>,
    tokens: Vec<u32>,
    out: &'a mut dyn Write,
}

impl Reply<'_, '_> {
    /// Takes a sampled token; returns why the reply ends, if it does.
    fn push(&mut self, token: u32, sampler: &mut Sampler) -> Result<Option<Finish>, GenerateError> {
        sampler.accept(token);
        self.tokens.push(token);
        let release = self.choice.push(token);
        self.write(release)
    }

    fn write(&mut self, release: Release) -> Result<Option<Finish>, GenerateError> {
        self.out.write_all(release.text.as_bytes())?;
        self.out.flush()?;
        Ok(release.finish)
    }
}

#[cfg(test)]
#[path = "generate_tests.rs"]
mod tests;
