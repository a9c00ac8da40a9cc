//! `octoflow run`: generate text from a prompt, or chat interactively. Flags follow llama.cpp's.
//! Generated text goes to stdout; logs and timings to stderr.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use octoflow_core::{Draw, Sampler, SamplingParams};
use octoflow_generate::shift::common_prefix;
use octoflow_generate::{generate, ContextShift, Limits, Stats};
use octoflow_text::{harmony, ChatTemplate, Message, Tokenizer};

use super::channels::ChannelWriter;
use super::common::{AnySession, DeviceArgs, Loaded};

/// Arguments of `octoflow run`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: a .gguf path, a Hugging Face folder, a known name or a URL (default: the default model).
    #[arg(short = 'm', long)]
    model: Option<String>,
    #[command(flatten)]
    load: super::common::LoadArgs,
    /// Prompt text.
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long, conflicts_with = "prompt")]
    file: Option<PathBuf>,
    /// Number of tokens to generate (-1: until end of generation or a full context).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_hyphen_values = true,
          value_parser = super::common::parse_n_predict)]
    max_tokens: i64,
    /// Context size in tokens (0: the model's training context, capped at 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    ctx_size: usize,
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8, allow_hyphen_values = true,
          value_parser = super::common::parse_non_negative)]
    temp: f32,
    /// Top-k (0 disables).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Top-p (1.0 disables).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Min-p (0 disables).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty (1.0 disables).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Tokens the penalties look back over.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Presence penalty.
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Frequency penalty.
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Seed of the sampler (default: random, printed to stderr).
    #[arg(short = 's', long)]
    seed: Option<u64>,
    /// Stop when this string is generated (repeatable); it is not printed.
    #[arg(long = "stop")]
    stops: Vec<String>,
    /// Keep generating after end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// When the context fills, keep the first `--keep` tokens and the newer half of the rest
    /// and go on (llama.cpp's context shift; the kept tokens are fed again) instead of ending;
    /// a prompt or conversation longer than the context is shifted the same way instead of
    /// refused.
    #[arg(long)]
    context_shift: bool,
    /// Tokens at the start that a context shift keeps: N, or -1 for the whole first prompt
    /// (default: the BOS, where the model adds one).
    #[arg(long, requires = "context_shift", allow_hyphen_values = true)]
    keep: Option<i64>,
    /// Interactive chat: read user turns from stdin, render them with the chat template.
    #[arg(long, visible_alias = "cnv")]
    chat: bool,
    /// System message for chat mode.
    #[arg(long)]
    system: Option<String>,
    /// Render -p as one user turn with the chat template (one-shot chat).
    #[arg(long)]
    chat_prompt: bool,
    /// A Jinja chat template file overriding the model's.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Models that answer in channels (gpt-oss): also show the analysis channel (the chain of
    /// thought), on stderr marked `[reasoning]`; stdout keeps the final channel only.
    #[arg(long)]
    reasoning: bool,
    /// Reasoning effort passed to the chat template (gpt-oss's `reasoning_effort`).
    #[arg(long, value_enum)]
    reasoning_effort: Option<Effort>,
    #[command(flatten)]
    lora: super::common::LoraArgs,
    #[command(flatten)]
    device: DeviceArgs,
    /// Decode steps per GPU submit (the sampled token of each step feeds the next on the GPU).
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Print per-kernel GPU time of the last decode submit (GPU timestamps) to stderr.
    #[arg(long)]
    profile: bool,
}

/// gpt-oss's reasoning efforts.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Effort {
    Low,
    Medium,
    High,
}

impl Args {
    /// Variables the chat template gets beside the conversation.
    fn template_vars(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut vars = serde_json::Map::new();
        if let Some(e) = self.reasoning_effort {
            let e = match e {
                Effort::Low => "low",
                Effort::Medium => "medium",
                Effort::High => "high",
            };
            vars.insert("reasoning_effort".into(), e.into());
        }
        vars
    }
}

/// Runs `octoflow run`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let params = sampling_params(&args)?;
    let path = super::common::model_path(args.model.as_deref())?;
    let gguf = Arc::new(args.load.open(&path)?);
    let tokenizer = super::common::tokenizer(&path, &gguf)?;
    let config = octoflow_model::ModelConfig::from_gguf(&gguf)?;
    let adapters = args.lora.load(&config)?;
    let (model, loaded) = super::common::load_model(gguf.clone(), &adapters, &args.device)?;
    let n_ctx = if args.ctx_size > 0 {
        args.ctx_size
    } else {
        model.config.n_ctx_train.min(4096)
    };
    tracing::info!(model = %path.display(), n_ctx, seed = params.seed, "loaded");
    eprintln!(
        "octoflow: {} | ctx {n_ctx} | seed {}",
        path.display(),
        params.seed
    );
    let template = match &args.chat_template {
        Some(file) => {
            let piece = |id: Option<u32>| {
                id.map(|id| {
                    String::from_utf8_lossy(tokenizer.token_to_piece(id, true)).into_owned()
                })
                .unwrap_or_default()
            };
            let sp = tokenizer.special();
            Some(ChatTemplate::from_file(
                file,
                &piece(sp.bos),
                &piece(sp.eos),
            )?)
        }
        None if args.chat || args.chat_prompt => Some(ChatTemplate::from_gguf(&gguf)?),
        None => None,
    };
    let limits = Limits {
        max_tokens: usize::try_from(args.max_tokens).ok(),
        stops: args.stops.clone(),
        ignore_eos: args.ignore_eos,
    };
    let mut session = loaded.session(&model, n_ctx, args.steps)?;
    if let (true, AnySession::Gpu(s)) = (args.profile, &mut session) {
        s.set_profiling(true)?;
    }
    let mut sampler = Sampler::new(params);
    if args.chat {
        let template = template.context("chat mode needs a chat template")?;
        warm_up(&loaded, &mut session, &sampler, usize::MAX)?;
        return chat(
            session.as_dyn(),
            &tokenizer,
            &mut sampler,
            &template,
            &args,
            &limits,
        );
    }
    let text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt file {}", f.display()))?,
        (None, None) => bail!("give a prompt with -p TEXT or -f FILE, or use --chat"),
    };
    let text = match &template {
        Some(t) if args.chat_prompt => t.render_with(
            &messages(&args.system, &[], &text),
            true,
            &args.template_vars(),
        )?,
        _ => text,
    };
    let prompt = tokenizer.encode(&text, true, true);
    let mut shift = context_shift(&args, &tokenizer, &prompt)?;
    warm_up(&loaded, &mut session, &sampler, prompt.len().min(n_ctx - 1))?;
    let mut out = channel_writer(&tokenizer, &args, template.is_some() && args.chat_prompt);
    let (_, stats) = generate(
        session.as_dyn(),
        &tokenizer,
        &mut sampler,
        &prompt,
        &limits,
        shift.as_mut(),
        &mut out,
    )?;
    out.finish()?;
    println!();
    eprintln!("{}", report(&stats));
    if let AnySession::Gpu(s) = &session {
        if let Some(profile) = s.profile() {
            eprintln!("{}", super::profile::table(profile, s.steps_per_submit()));
        }
    }
    Ok(())
}

/// The context shift `--context-shift` asks for, keeping `--keep` tokens of a session whose
/// first prompt is `first`.
fn context_shift(
    args: &Args,
    tokenizer: &Tokenizer,
    first: &[u32],
) -> anyhow::Result<Option<ContextShift>> {
    if !args.context_shift {
        return Ok(None);
    }
    let keep = match args.keep {
        None => usize::from(
            first
                .first()
                .is_some_and(|&t| Some(t) == tokenizer.special().bos),
        ),
        Some(-1) => first.len(),
        Some(n) => usize::try_from(n)
            .map_err(|_| anyhow::anyhow!("--keep {n}: give a count of tokens, or -1"))?,
    };
    Ok(Some(ContextShift::new(keep)))
}

/// Records the chains a generation with `sampler` from a prompt of `prompt_len` tokens replays
/// (on the GPU), so its timings are of the model, not of the driver's compiler.
fn warm_up(
    loaded: &Loaded,
    session: &mut AnySession<'_>,
    sampler: &Sampler,
    prompt_len: usize,
) -> anyhow::Result<()> {
    if let (Loaded::Gpu(g), AnySession::Gpu(s)) = (loaded, session) {
        let draw =
            Draw::from_sampler(sampler).filter(|d| octoflow_model::Forward::device_samples(&*s, d));
        super::warm::warm_up("octoflow", g.context(), || {
            Ok(s.warm_up(draw.as_ref(), prompt_len)?)
        })?;
    }
    Ok(())
}

/// Where the reply goes: stdout, split by channel for models that answer in channels when the
/// prompt is a rendered conversation (`chat`; a raw prompt's text is printed as it comes).
fn channel_writer(
    tokenizer: &Tokenizer,
    args: &Args,
    chat: bool,
) -> ChannelWriter<std::io::Stdout, std::io::Stderr> {
    let harmony = chat && harmony::uses_harmony(tokenizer.vocab());
    ChannelWriter::new(
        std::io::stdout(),
        std::io::stderr(),
        harmony,
        args.reasoning,
    )
}

fn sampling_params(args: &Args) -> anyhow::Result<SamplingParams> {
    let seed = args.seed.unwrap_or_else(octoflow_core::random_seed);
    let p = SamplingParams {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed,
    };
    p.validate().map_err(anyhow::Error::msg)?;
    Ok(p)
}

fn messages(system: &Option<String>, history: &[Message], user: &str) -> Vec<Message> {
    let mut m: Vec<Message> = system.iter().map(Message::system).collect();
    m.extend_from_slice(history);
    m.push(Message::user(user));
    m
}

/// Interactive chat: each turn renders the whole conversation and feeds only the new suffix.
fn chat(
    session: &mut dyn octoflow_model::Forward,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    template: &ChatTemplate,
    args: &Args,
    limits: &Limits,
) -> anyhow::Result<()> {
    let mut history: Vec<Message> = Vec::new();
    // The conversation's tokens as fed, before any context shift; a shifting session holds
    // `shift.held` instead.
    let mut fed: Vec<u32> = Vec::new();
    let mut shift: Option<ContextShift> = None;
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    loop {
        eprint!("\n> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            return Ok(());
        }
        let user = line.trim_end_matches(['\n', '\r']);
        if user.is_empty() {
            continue;
        }
        let text = template.render_with(
            &messages(&args.system, &history, user),
            true,
            &args.template_vars(),
        )?;
        let all = tokenizer.encode(&text, true, true);
        // The rendered conversation normally extends what was fed; if the template rewrote
        // earlier turns, start over from the first difference.
        let common = common_prefix(&fed, &all).min(all.len().saturating_sub(1));
        if shift.is_none() && history.is_empty() {
            shift = context_shift(args, tokenizer, &all)?;
        }
        let start = match shift.as_mut() {
            // shifted: the new turn follows what the session holds when the conversation only
            // grew; else the session keeps what it shares with the new rendering
            Some(s) if s.held != fed && common < fed.len() => {
                let kept = common_prefix(&s.held, &all).min(all.len().saturating_sub(1));
                session.truncate(kept);
                s.held.truncate(kept);
                kept
            }
            Some(s) if s.held != fed => common,
            Some(s) => {
                session.truncate(common);
                s.held.truncate(common);
                common
            }
            None => {
                session.truncate(common);
                common
            }
        };
        let mut out = channel_writer(tokenizer, args, true);
        let (reply_ids, stats) = generate(
            session,
            tokenizer,
            sampler,
            &all[start..],
            limits,
            shift.as_mut(),
            &mut out,
        )?;
        out.finish()?;
        stdout.lock().write_all(b"\n")?;
        eprintln!("{}", report(&stats));
        let mut reply = tokenizer.decode(&reply_ids);
        if harmony::uses_harmony(tokenizer.vocab()) {
            // The conversation keeps the answer; templates drop earlier turns' reasoning.
            reply = harmony::Reply::parse(&reply).content;
        }
        fed = all;
        // The reply's tokens up to (not including) the last one are in the cache.
        fed.extend_from_slice(&reply_ids[..reply_ids.len().saturating_sub(1)]);
        history.push(Message::user(user));
        history.push(Message::assistant(reply.trim_end()));
    }
}

/// One line of timings for stderr, like llama.cpp's `llama_perf_context_print`.
fn report(stats: &Stats) -> String {
    let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let mut line = format!(
        "prompt: {} tokens in {:.2} s ({:.1} tok/s) | generated: {} tokens in {:.2} s ({:.1} tok/s) | stop: {:?}",
        stats.prompt_tokens,
        stats.prompt_secs,
        rate(stats.prompt_tokens, stats.prompt_secs),
        stats.generated,
        stats.gen_secs,
        rate(stats.generated, stats.gen_secs),
        stats.finish
    );
    if stats.shifts > 0 {
        line.push_str(&format!(" | context shifts: {}", stats.shifts));
    }
    line
}
