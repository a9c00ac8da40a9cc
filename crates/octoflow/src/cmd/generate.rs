//! The generation loop shared by `run`'s one-shot and chat modes: prefill the prompt, then
//! sample, stream and stop, on the CPU reference path.

use std::io::Write;
use std::time::Instant;

use anyhow::bail;
use octoflow_model::Session;
use octoflow_text::sampling::Sampler;
use octoflow_text::stop::StopMatcher;
use octoflow_text::Tokenizer;

/// Prompt tokens are run through the model in chunks of this many (one weight pass per chunk).
pub const PREFILL_CHUNK: usize = 256;

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token (EOS, EOT).
    Eog,
    /// A stop string.
    Stop,
    /// `-n` tokens were generated.
    Length,
    /// The context is full.
    Context,
}

/// Counts and timings of one generation.
#[derive(Debug, Clone)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub prompt_secs: f64,
    pub generated: usize,
    pub gen_secs: f64,
    pub finish: Finish,
}

/// Limits of one generation.
pub struct Limits<'a> {
    /// At most this many new tokens (`None`: until end of generation or a full context).
    pub max_tokens: Option<usize>,
    pub stops: &'a [String],
    pub ignore_eos: bool,
}

/// Feeds `prompt` (appended after what the session already holds) and streams the reply to `out`.
/// Returns the generated token ids (the last one included) and the statistics.
pub fn generate(
    session: &mut Session<'_>,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    limits: &Limits<'_>,
    out: &mut dyn Write,
) -> anyhow::Result<(Vec<u32>, Stats)> {
    let n_ctx = session.cache().n_ctx();
    if prompt.is_empty() {
        bail!("the prompt is empty (no tokens to start from)");
    }
    if session.n_past() + prompt.len() >= n_ctx {
        bail!(
            "the prompt has {} tokens and {} are already in the context, but the context holds {n_ctx}; \
             raise -c/--ctx-size or shorten the prompt",
            prompt.len(),
            session.n_past()
        );
    }
    for &t in prompt {
        sampler.accept(t);
    }
    let t0 = Instant::now();
    let mut logits = session.prefill(prompt, PREFILL_CHUNK)?;
    let prompt_secs = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut decoder = tokenizer.stream_decoder();
    let mut stop = StopMatcher::new(limits.stops.iter().cloned());
    let mut generated = Vec::new();
    let finish = loop {
        let token = sampler.sample(&logits);
        sampler.accept(token);
        generated.push(token);
        if !limits.ignore_eos && tokenizer.is_eog(token) {
            break Finish::Eog;
        }
        let step = stop.push(&decoder.push(token));
        out.write_all(step.emit.as_bytes())?;
        out.flush()?;
        if step.stopped {
            break Finish::Stop;
        }
        if limits.max_tokens.is_some_and(|n| generated.len() >= n) {
            break Finish::Length;
        }
        if session.n_past() + 1 >= n_ctx {
            break Finish::Context;
        }
        logits = session.decode(token)?;
    };
    if finish != Finish::Stop {
        let rest = stop.push(&decoder.finish());
        out.write_all(rest.emit.as_bytes())?;
        out.write_all(stop.finish().as_bytes())?;
    }
    out.flush()?;
    // The last sampled token has not been run through the model yet; a chat turn that follows
    // starts by feeding it, so the cache and the transcript stay in step.
    let stats = Stats {
        prompt_tokens: prompt.len(),
        prompt_secs,
        generated: generated.len(),
        gen_secs: t1.elapsed().as_secs_f64(),
        finish,
    };
    Ok((generated, stats))
}

/// One line of timings for stderr, like llama.cpp's `llama_perf_context_print`.
pub fn report(stats: &Stats) -> String {
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    format!(
        "prompt: {} tokens in {:.2} s ({:.1} tok/s) | generated: {} tokens in {:.2} s ({:.1} tok/s) | stop: {:?}",
        stats.prompt_tokens,
        stats.prompt_secs,
        rate(stats.prompt_tokens, stats.prompt_secs),
        stats.generated,
        stats.gen_secs,
        rate(stats.generated, stats.gen_secs),
        stats.finish
    )
}
