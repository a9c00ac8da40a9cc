//! `octoflow bench`: prompt processing (ppN) and generation (tgN) throughput in llama-bench's
//! shape: mean ± standard deviation over `-r` repetitions after one warm-up, timed with the host
//! clock around synchronized submits (each test waits for its last fence).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use octoflow_core::Draw;
use octoflow_model::{Forward, Logits};
use serde_json::json;

use super::common::{AnySession, DeviceArgs, Loaded};

/// Arguments of `octoflow bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: a .gguf path, a Hugging Face folder, a known name or a URL (default: the default model).
    #[arg(short = 'm', long)]
    model: Option<String>,
    #[command(flatten)]
    load: super::common::LoadArgs,
    /// Prompt tokens of the prompt-processing test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Tokens of the generation test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Context depths (llama-bench's `-d`, comma-separated): before each repetition of each
    /// test, this many tokens are prefilled (not timed), so the test runs after them; a test at
    /// depth D > 0 is named `pp512 @ dD`.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5)]
    repetitions: usize,
    /// Seconds each test is run before it is timed (at least once): GPUs idle at low clocks and
    /// take a while under load to reach full speed (an H100 idles at 345 MHz, boosts to 1980).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Decode steps per GPU submit in the generation test.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Stream counts for llama-batched-bench's table instead of pp/tg (e.g. `1,8,32,64,128`):
    /// that many sequences prefilled and decoded together (GPU only).
    #[arg(long, value_delimiter = ',')]
    streams: Vec<usize>,
    /// Prompt tokens per stream with `--streams`.
    #[arg(long, default_value_t = 128)]
    stream_prompt: usize,
    /// Generated tokens per stream with `--streams`.
    #[arg(long, default_value_t = 128)]
    stream_gen: usize,
    /// Gate decode steps on the GPU's stop flag (indirect dispatches) or run them direct.
    #[arg(long, default_value = "off", value_parser = ["on", "off"])]
    gate: String,
    /// Print per-kernel GPU time (timestamps) of the last repetition of each test to stderr.
    #[arg(long)]
    profile: bool,
    #[command(flatten)]
    device: DeviceArgs,
    /// Adapters applied on the fly while measuring (`--lora`, `--lora-scaled`).
    #[command(flatten)]
    lora: super::common::LoraArgs,
    /// Pacing (`--temp-target`, `--power-target`): each repetition waits its pacing delay inside
    /// its timed span, so the rates are what the target leaves; `--sensor-log` traces the run.
    #[command(flatten)]
    homeo: super::homeo::HomeoArgs,
}

/// One test's result.
struct Row {
    test: String,
    tokens: usize,
    /// Tokens of context before the test.
    depth: usize,
    rates: Vec<f64>,
    /// Joules per token over the repetitions, from the GPU's sensor (`None` without one).
    joules_per_token: Option<f64>,
}

/// llama-bench's test name: `pp512`, `tg128`, or `pp512 @ d8192` after 8192 tokens of context.
fn test_name(kind: &str, tokens: usize, depth: usize) -> String {
    if depth == 0 {
        format!("{kind}{tokens}")
    } else {
        format!("{kind}{tokens} @ d{depth}")
    }
}

impl Row {
    fn mean(&self) -> f64 {
        self.rates.iter().sum::<f64>() / self.rates.len().max(1) as f64
    }

    fn std(&self) -> f64 {
        let n = self.rates.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.rates.iter().map(|r| (r - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

/// Runs `octoflow bench`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    let path = super::common::model_path(args.model.as_deref())?;
    let gguf = Arc::new(args.load.open(&path)?);
    let config = octoflow_model::ModelConfig::from_gguf(&gguf)?;
    let adapters = args.lora.load(&config)?;
    let (model, loaded) = super::common::load_model(gguf.clone(), &adapters, &args.device)?;
    // the energy counter (or integrated power) of the GPU in use, read at each test's ends
    let sensor = match &loaded {
        Loaded::Gpu(g) => args
            .homeo
            .start(Some(g.context().caps()), "octoflow bench")?,
        // the CPU has nothing to read; say so only where a target asked for pacing
        Loaded::Cpu if args.homeo.targets()?.any() => args.homeo.start(None, "octoflow bench")?,
        Loaded::Cpu => octoflow_homeo::Pacer::off(),
    };
    if !args.streams.is_empty() {
        if args.homeo.targets()?.any() {
            bail!("--temp-target/--power-target pace the pp/tg tests, not --streams");
        }
        let Loaded::Gpu(gpu) = &loaded else {
            bail!("--streams runs on the GPU (not with --device cpu)");
        };
        let rows = super::batched::measure(
            gpu,
            &args.streams,
            args.stream_prompt,
            args.stream_gen,
            args.profile,
            args.warmup,
        )?;
        let c = gpu.context().caps();
        let device = format!("{} ({} {})", c.name, c.driver_name, c.driver_info);
        return super::batched::print(
            &rows,
            args.stream_prompt,
            args.stream_gen,
            &device,
            args.json,
        );
    }
    let n_vocab = model.config.n_vocab as u64;
    // Arbitrary but valid and repeatable token ids.
    let tokens = |n: usize| -> Vec<u32> {
        (0..n as u64)
            .map(|i| ((i * 7919 + 13) % n_vocab) as u32)
            .collect()
    };
    let max_depth = args.n_depth.iter().copied().max().unwrap_or(0);
    let n_ctx = (max_depth + args.n_prompt.max(1) + args.n_gen + 1).max(16);
    let mut session = loaded.session(&model, n_ctx, args.steps)?;
    if let (true, AnySession::Gpu(s)) = (args.profile, &mut session) {
        s.set_profiling(true)?;
    }
    if let AnySession::Gpu(s) = &mut session {
        s.set_gated(args.gate == "on");
    }
    let mut rows = Vec::new();
    for &depth in &args.n_depth {
        let context = tokens(depth);
        if args.n_prompt > 0 {
            let prompt = tokens(args.n_prompt);
            let pp = |s: &mut dyn Forward| -> anyhow::Result<f64> {
                prefill(s, &context)?;
                let t = Instant::now();
                sensor.before_submit();
                s.forward(&prompt, depth, Logits::Last)?;
                Ok(args.n_prompt as f64 / t.elapsed().as_secs_f64())
            };
            warm_up(args.warmup, || pp(session.as_dyn()).map(drop))?;
            let e0 = sensor.energy_now();
            let rates = (0..args.repetitions)
                .map(|_| pp(session.as_dyn()))
                .collect::<anyhow::Result<_>>()?;
            let joules =
                energy_per_token(e0, sensor.energy_now(), args.n_prompt * args.repetitions);
            let test = test_name("pp", args.n_prompt, depth);
            print_profile(&session, &test, 1);
            rows.push(Row {
                test,
                tokens: args.n_prompt,
                depth,
                rates,
                joules_per_token: joules,
            });
        }
        if args.n_gen > 0 {
            let first = tokens(1)[0];
            let run = |session: &mut AnySession<'_>| -> anyhow::Result<f64> {
                prefill(session.as_dyn(), &context)?;
                let t = Instant::now();
                sensor.before_submit();
                tg(session, first, args.n_gen)?;
                Ok(args.n_gen as f64 / t.elapsed().as_secs_f64())
            };
            warm_up(args.warmup, || run(&mut session).map(drop))?;
            let e0 = sensor.energy_now();
            let rates = (0..args.repetitions)
                .map(|_| run(&mut session))
                .collect::<anyhow::Result<_>>()?;
            let joules = energy_per_token(e0, sensor.energy_now(), args.n_gen * args.repetitions);
            let test = test_name("tg", args.n_gen, depth);
            print_profile(&session, &test, args.steps);
            rows.push(Row {
                test,
                tokens: args.n_gen,
                depth,
                rates,
                joules_per_token: joules,
            });
        }
    }
    if let Loaded::Gpu(gpu) = &loaded {
        report_memory(gpu, n_ctx);
    }
    print(&args, &path, &gguf, &loaded, &rows)
}

/// Prints the device memory the process holds against the floor of weights + KV cache.
fn report_memory(gpu: &octoflow_model::gpu::GpuModel, n_ctx: usize) {
    let c = &gpu.config;
    let (in_buffers, reserved) = gpu.context().memory_usage();
    let weights = gpu.weight_bytes();
    let kv_type = gpu.kv_type();
    let kv = c.n_layer as u64
        * (kv_type.bytes_for((n_ctx * c.k_dim()) as u64)
            + kv_type.bytes_for((n_ctx * c.v_dim()) as u64));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "octoflow: device memory {:.1} MiB reserved ({:.1} MiB in buffers) = weights {:.1} MiB + KV cache {:.1} MiB ({n_ctx} positions, {kv_type}) + {:.1} MiB other ({:.1}% over weights + KV)",
        mib(reserved),
        mib(in_buffers),
        mib(weights),
        mib(kv),
        mib(reserved.saturating_sub(weights + kv)),
        100.0 * reserved.saturating_sub(weights + kv) as f64 / (weights + kv) as f64
    );
}

/// Runs `test` once, then again until `seconds` have passed since the start.
/// J/token between two readings of the energy meter over `tokens` tokens (the prefill of a
/// test's depth included: it runs between the readings too).
fn energy_per_token(before: Option<f64>, after: Option<f64>, tokens: usize) -> Option<f64> {
    let (b, a) = (before?, after?);
    octoflow_homeo::energy::joules_per_token(a - b, tokens as u64)
}

fn warm_up(seconds: f64, mut test: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let t = Instant::now();
    test()?;
    while t.elapsed().as_secs_f64() < seconds {
        test()?;
    }
    Ok(())
}

fn print_profile(session: &AnySession<'_>, test: &str, steps: usize) {
    if let AnySession::Gpu(s) = session {
        if let Some(p) = s.profile() {
            eprintln!("{test}: {}", super::profile::table(p, steps));
        }
    }
}

/// Empties the session and prefills `context` (a test's depth; nothing for depth 0).
fn prefill(s: &mut dyn Forward, context: &[u32]) -> anyhow::Result<()> {
    s.truncate(0);
    if !context.is_empty() {
        s.forward(context, 0, Logits::None)?;
    }
    Ok(())
}

/// Generates `n` tokens greedily after one fed token, after whatever the session holds,
/// ignoring end-of-generation: on the GPU as multi-step decode chains, on the CPU one token at
/// a time.
fn tg(session: &mut AnySession<'_>, first: u32, n: usize) -> anyhow::Result<()> {
    let s = session.as_dyn();
    let draw = Draw::greedy(0);
    let mut token = first;
    let mut done = 0;
    while done < n {
        if s.device_samples(&draw) {
            let steps = s.decode_steps(token, &draw, n - done, &[])?;
            done += steps.tokens.len();
            token = *steps
                .tokens
                .last()
                .context("the device ran no decode step")?;
        } else {
            token = draw.sample_cpu(&s.decode(token)?);
            done += 1;
        }
    }
    Ok(())
}

/// What the KV cache holds (the CPU reference's is f32).
fn kv_name(loaded: &Loaded) -> &'static str {
    match loaded {
        Loaded::Cpu => "f32",
        Loaded::Gpu(g) => g.kv_type().name(),
    }
}

fn print(
    args: &Args,
    path: &std::path::Path,
    gguf: &octoflow_gguf::GgufFile,
    loaded: &Loaded,
    rows: &[Row],
) -> anyhow::Result<()> {
    let name = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let params: u64 = gguf.tensors().iter().map(|t| t.n_elements()).sum();
    let bytes: u64 = gguf.tensors().iter().map(|t| t.size).sum();
    let (backend, device, driver) = match loaded {
        Loaded::Cpu => (
            "CPU".to_string(),
            "CPU reference".to_string(),
            String::new(),
        ),
        Loaded::Gpu(g) => {
            let c = g.context().caps();
            (
                "Vulkan".to_string(),
                c.name.clone(),
                format!("{} {}", c.driver_name, c.driver_info),
            )
        }
    };
    if args.json {
        let tests: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"test": r.test, "n_tokens": r.tokens, "n_depth": r.depth,
                       "repetitions": r.rates.len(),
                       "avg_ts": r.mean(), "stddev_ts": r.std(), "samples_ts": r.rates,
                       "joules_per_token": r.joules_per_token,
                       "tokens_per_joule": r.joules_per_token.map(|j| 1.0 / j)})
            })
            .collect();
        let doc = json!({
            "model": name, "model_size": bytes, "model_n_params": params, "backend": backend,
            "device": device, "driver": driver, "steps_per_submit": args.steps,
            "type_kv": kv_name(loaded), "tests": tests,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!(
        "device: {device} | driver: {driver} | KV cache: {}",
        kv_name(loaded)
    );
    // J/token and tokens/J where the GPU has an energy sensor
    let energy = rows.iter().any(|r| r.joules_per_token.is_some());
    let tail = |j: Option<f64>| match (energy, j) {
        (false, _) => String::new(),
        (true, Some(j)) => format!(" {:>10.4} | {:>8.1} |", j, 1.0 / j),
        (true, None) => format!(" {:>10} | {:>8} |", "n/a", "n/a"),
    };
    let (head, rule) = match energy {
        true => (
            format!(" {:>10} | {:>8} |", "J/token", "token/J"),
            format!(" {:->10} | {:->8} |", "", ""),
        ),
        false => (String::new(), String::new()),
    };
    println!(
        "| {:<36} | {:>10} | {:>10} | {:<7} | {:>15} | {:>20} |{head}",
        "model", "size", "params", "backend", "test", "t/s"
    );
    println!(
        "| {:-<36} | {:->10} | {:->10} | {:-<7} | {:->15} | {:->20} |{rule}",
        "", "", "", "", "", ""
    );
    for r in rows {
        println!(
            "| {:<36} | {:>6.2} MiB | {:>8.2} M | {:<7} | {:>15} | {:>20} |{}",
            name,
            bytes as f64 / (1 << 20) as f64,
            params as f64 / 1e6,
            backend,
            r.test,
            format!("{:.2} ± {:.2}", r.mean(), r.std()),
            tail(r.joules_per_token)
        );
    }
    Ok(())
}
