//! The generation loop shared by `run`'s one-shot and chat modes: prefill the prompt, then
//! sample, stream and stop, on the GPU chains or the CPU reference.

use std::io::Write;
use std::time::Instant;

use anyhow::bail;
use octoflow_model::gpu::GpuDraw;
use octoflow_model::Forward;
use octoflow_text::sampling::Sampler;
use octoflow_text::stop::StopMatcher;
use octoflow_text::stream::StreamDecoder;
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
///
/// Where the session can decode several steps per submit with sampling on the device (the GPU
/// path, sampling parameters it supports), tokens come back in bursts and the CPU only streams
/// them; otherwise each step's logits come back and the CPU samples.
pub fn generate(
    session: &mut dyn Forward,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    prompt: &[u32],
    limits: &Limits<'_>,
    out: &mut dyn Write,
) -> anyhow::Result<(Vec<u32>, Stats)> {
    let n_ctx = session.n_ctx();
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
    let logits = session.prefill(prompt, PREFILL_CHUNK)?;
    let prompt_secs = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut emit = Emitter {
        tokenizer,
        decoder: tokenizer.stream_decoder(),
        stop: StopMatcher::new(limits.stops.iter().cloned()),
        generated: Vec::new(),
        limits,
        out,
    };
    let mut token = sampler.sample(&logits);
    sampler.accept(token);
    let mut finish = emit.push(token, session.n_past() + 1 >= n_ctx)?;
    let eog = gpu_eog_list(tokenizer, limits);
    while finish.is_none() {
        let remaining = limits
            .max_tokens
            .map_or(usize::MAX, |n| n - emit.generated.len());
        let draw = gpu_draw(sampler);
        let burst = match draw {
            Some(d) => session.decode_steps(token, &d, remaining, &eog),
            None => None,
        };
        match burst {
            Some(steps) => {
                let steps = steps?;
                if steps.tokens.is_empty() {
                    bail!("the device ran no decode step");
                }
                let base = session.n_past() - steps.tokens.len();
                sampler.skip(steps.tokens.len() as u64);
                for (i, &t) in steps.tokens.iter().enumerate() {
                    sampler.accept(t);
                    // Position base + i + 1 is the next one the model would be fed.
                    finish = emit.push(t, base + i + 2 >= n_ctx)?;
                    if finish.is_some() {
                        // The GPU may have run past a stop the CPU found (a stop string): the
                        // cache keeps only what this reply fed, i.e. every token before `t`.
                        session.truncate(base + i + 1);
                        break;
                    }
                    token = t;
                }
            }
            None => {
                let logits = session.decode(token)?;
                token = sampler.sample(&logits);
                sampler.accept(token);
                finish = emit.push(token, session.n_past() + 1 >= n_ctx)?;
            }
        }
    }
    let finish = finish.unwrap_or(Finish::Length);
    emit.finish(finish)?;
    // The last sampled token has not been run through the model yet; a chat turn that follows
    // starts by feeding it, so the cache and the transcript stay in step.
    let stats = Stats {
        prompt_tokens: prompt.len(),
        prompt_secs,
        generated: emit.generated.len(),
        gen_secs: t1.elapsed().as_secs_f64(),
        finish,
    };
    Ok((emit.generated, stats))
}

/// The sampler's parameters for the device sampler, when it can take them (no penalties: they
/// need the CPU's window of recent tokens).
pub(super) fn gpu_draw(sampler: &Sampler) -> Option<GpuDraw> {
    if sampler.penalized() {
        return None;
    }
    let p = sampler.params();
    let draw = GpuDraw {
        temperature: p.temperature,
        top_k: u32::try_from(p.top_k).unwrap_or(u32::MAX),
        top_p: p.top_p,
        min_p: p.min_p,
        seed: p.seed,
        step: sampler.step(),
    };
    draw.supported().then_some(draw)
}

/// End-of-generation ids for the device to stop on, the primary ones first (it checks a few).
fn gpu_eog_list(tokenizer: &Tokenizer, limits: &Limits<'_>) -> Vec<u32> {
    if limits.ignore_eos {
        return Vec::new();
    }
    let sp = tokenizer.special();
    let mut ids: Vec<u32> = [sp.eos, sp.eot, sp.eom].into_iter().flatten().collect();
    for &id in &sp.eog {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids.retain(|&id| tokenizer.is_eog(id));
    ids
}

/// Streams generated tokens as text and decides when generation ends.
struct Emitter<'a> {
    tokenizer: &'a Tokenizer,
    decoder: StreamDecoder<'a>,
    stop: StopMatcher,
    generated: Vec<u32>,
    limits: &'a Limits<'a>,
    out: &'a mut dyn Write,
}

impl Emitter<'_> {
    /// Takes one sampled token (`context_full`: no position is left to feed it); returns why
    /// generation ends here, if it does.
    fn push(&mut self, token: u32, context_full: bool) -> anyhow::Result<Option<Finish>> {
        self.generated.push(token);
        if !self.limits.ignore_eos && self.tokenizer.is_eog(token) {
            return Ok(Some(Finish::Eog));
        }
        let step = self.stop.push(&self.decoder.push(token));
        self.out.write_all(step.emit.as_bytes())?;
        self.out.flush()?;
        if step.stopped {
            return Ok(Some(Finish::Stop));
        }
        if self
            .limits
            .max_tokens
            .is_some_and(|n| self.generated.len() >= n)
        {
            return Ok(Some(Finish::Length));
        }
        Ok(context_full.then_some(Finish::Context))
    }

    /// Flushes what the decoder and the stop matcher still hold.
    fn finish(&mut self, finish: Finish) -> anyhow::Result<()> {
        if finish != Finish::Stop {
            let rest = self.stop.push(&self.decoder.finish());
            self.out.write_all(rest.emit.as_bytes())?;
            self.out.write_all(self.stop.finish().as_bytes())?;
        }
        self.out.flush()?;
        Ok(())
    }
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
