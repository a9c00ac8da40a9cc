//! `octoflow agents`: many instances of one model driven by an agent program (a shipped
//! pattern or a `.s` file, docs/VM.md) over a task file; every output is written to the output
//! file as soon as it is produced.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use octoflow_agents::{Event, GpuRun, Program, Run, RunConfig};
use octoflow_model::{BatchForward, CpuBatch};
use octoflow_serve::agents::lines::Lines;
use octoflow_serve::agents::source::Source;
use octoflow_serve::agents::tasks::{Task, TaskError, TaskSpec};
use octoflow_text::{ChatTemplate, Tokenizer};
use serde_json::Value;

use super::common::{DeviceArgs, Loaded};

/// Arguments of `octoflow agents`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: a .gguf path, a Hugging Face folder, a known name or a URL (default: the default model).
    #[arg(short = 'm', long)]
    model: Option<String>,
    #[command(flatten)]
    load: super::common::LoadArgs,
    /// A shipped program: queue, best-of, debate or swarm (docs/VM.md).
    #[arg(long, required_unless_present = "program")]
    pattern: Option<String>,
    /// An agent program in the VM's assembly (docs/VM.md) instead of a shipped pattern.
    #[arg(long, conflicts_with = "pattern")]
    program: Option<PathBuf>,
    /// Tasks, one JSON object per line: `{"id": ..., "prompt": "..."}` or `{"id": ...,
    /// "messages": [{"role": ..., "content": ...}]}` (rendered with the chat template).
    #[arg(long)]
    tasks: PathBuf,
    /// Instances (each with its own KV cache of --ctx-size positions).
    #[arg(long, default_value_t = 8)]
    instances: usize,
    /// Rounds (`%rounds`: the debate's).
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Token limit of a generation (`%max`).
    #[arg(short = 'n', long = "n-predict", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: u32,
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8, allow_hyphen_values = true,
          value_parser = super::common::parse_non_negative)]
    temp: f32,
    /// Top-k (0 disables).
    #[arg(long, default_value_t = 40)]
    top_k: u32,
    /// Top-p (1.0 disables).
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Min-p (0 disables).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Run seed: instance i starts at seed + i, and `seed x` in a program sets seed + x
    /// (default: random, printed to stderr).
    #[arg(short = 's', long)]
    seed: Option<u64>,
    /// Context size of each instance in tokens (0: the model's training context, capped at 4096).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    ctx_size: usize,
    /// Most rows (tokens) per batched step: a prompt feeds at most this many a step, and a GPU
    /// step runs this many rows whatever it needs (0: the instances plus half as many, at
    /// least 32, a multiple of 16: room for prompts beside every instance's decode row).
    #[arg(long, default_value_t = 0)]
    max_rows: usize,
    /// A Jinja chat template file overriding the model's (for tasks given as messages).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Steps per GPU submit: the programs run on the GPU, K whole steps (interpret, plan, the
    /// batched forward, advance) per submit; 0 interprets them on the host between steps (as
    /// `--device cpu` always does). Default: 16 on a GPU, 0 on a CPU
    /// Vulkan driver (lavapipe), where running every step at `--max-rows` rows costs more than
    /// the host's turns between steps.
    #[arg(long)]
    steps: Option<u32>,
    /// Times every GPU dispatch (timestamps) and prints the GPU time per kernel over the run:
    /// the VM's phases (`vm/…`) and each row bucket's forward (`rows{N}/…`). Needs `--steps`
    /// above 0 on a device with timestamps; slows the run a little.
    #[arg(long)]
    profile: bool,
    /// Output file: one JSON object per output, written as it is produced.
    #[arg(short = 'o', long)]
    output: PathBuf,
    #[command(flatten)]
    device: DeviceArgs,
    #[command(flatten)]
    homeo: super::homeo::HomeoArgs,
}

/// Runs `octoflow agents`.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.instances == 0 {
        bail!("--instances must be at least 1");
    }
    let source = match (&args.pattern, &args.program) {
        (Some(p), _) => Source::pattern(p)?,
        (None, Some(f)) => Source::Text {
            name: f.display().to_string(),
            text: std::fs::read_to_string(f)
                .with_context(|| format!("reading the program {}", f.display()))?,
        },
        (None, None) => bail!("give --pattern NAME or --program FILE.s"),
    };
    let source_name = source.name();
    let path = super::common::model_path(args.model.as_deref())?;
    let gguf = Arc::new(args.load.open(&path)?);
    let tokenizer = super::common::tokenizer(&path, &gguf)?;
    let program = source
        .assemble(&tokenizer)
        .with_context(|| format!("assembling {source_name}"))?;
    let tasks = read_tasks(&args, &gguf, &tokenizer)?;
    let model = octoflow_model::Model::from_gguf(gguf.clone()).context("loading the model")?;
    let n_ctx = if args.ctx_size > 0 {
        args.ctx_size
    } else {
        model.config.n_ctx_train.min(4096)
    };
    let seed = args.seed.unwrap_or_else(octoflow_core::random_seed);
    let max_rows = match args.max_rows {
        0 => (args.instances + (args.instances / 2).max(32)).next_multiple_of(16),
        n => n,
    };
    let config = RunConfig {
        instances: args.instances,
        max_tokens: args.max_tokens,
        rounds: args.rounds,
        seed,
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        eog: octoflow_generate::device_eog(&tokenizer, false),
        chunk: max_rows,
        device_sampling: true,
        ..RunConfig::default()
    };
    eprintln!(
        "octoflow agents: {} | {source_name} | {} tasks | {} instances × ctx {n_ctx} | seed {seed}",
        path.display(),
        tasks.len(),
        args.instances
    );
    let out = File::create(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let mut sink = Sink {
        out: BufWriter::new(out),
        tokenizer: &tokenizer,
        lines: Lines::new(tasks.iter().map(|t| t.id.clone()).collect()),
    };
    let prompts = tasks.into_iter().map(|t| t.tokens).collect();
    let loaded = Loaded::new(&model, &args.device)?;
    let caps = match &loaded {
        Loaded::Gpu(g) => Some(g.context().caps()),
        Loaded::Cpu => None,
    };
    let pacer = args.homeo.start(caps, "octoflow agents")?;
    // The clocks start when the run does: loading, recording chains and warming up are
    // start-up (printed on their own), as a server's start is not part of its requests' time.
    let (stats, t0, cpu0) = match &loaded {
        Loaded::Cpu => {
            if args.profile {
                bail!("--profile times GPU chains: it needs a GPU device");
            }
            let mut engine = CpuBatch::new(&model, args.instances, n_ctx, max_rows);
            let (t0, cpu0) = (Instant::now(), cpu_seconds());
            (
                drive(&mut engine, program, config, prompts, &mut sink, &pacer)?,
                t0,
                cpu0,
            )
        }
        Loaded::Gpu(g) if steps_on(g, args.steps) > 0 => {
            let steps = steps_on(g, args.steps);
            let built = g.context().pipelines_built();
            let t = Instant::now();
            let mut gpu = GpuRun::new(g, program, config, prompts, n_ctx, max_rows, steps)
                .context("starting the run on the GPU")?;
            if args.profile {
                gpu.set_profiling(true).context("turning profiling on")?;
            }
            eprintln!(
                "octoflow agents: on the GPU, {} steps a submit ({:.2} s to record, {} pipeline(s) built)",
                steps,
                t.elapsed().as_secs_f64(),
                g.context().pipelines_built() - built
            );
            super::warm::save_pipelines(g.context());
            let (t0, cpu0) = (Instant::now(), cpu_seconds());
            (drive_gpu(gpu, &mut sink, &pacer)?, t0, cpu0)
        }
        Loaded::Gpu(g) => {
            if args.profile {
                bail!("--profile times the GPU interpreter's chains: give --steps above 0");
            }
            let mut engine = g
                .batch(args.instances, n_ctx, max_rows)
                .context("allocating the instances' KV caches and buffers on the GPU")?;
            super::warm::warm_up("octoflow agents", g.context(), || Ok(engine.warm_up()?))?;
            let (t0, cpu0) = (Instant::now(), cpu_seconds());
            (
                drive(&mut engine, program, config, prompts, &mut sink, &pacer)?,
                t0,
                cpu0,
            )
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    let host = cpu_seconds() - cpu0;
    let busy = stats.gpu_seconds.map_or(String::new(), |g| {
        format!(" | GPU busy {:.1}% of the wall time", 100.0 * g / secs)
    });
    eprintln!(
        "octoflow agents: {} outputs ({} errors) to {} | {} tokens generated in {:.2} s: {:.1} tasks/s, {:.1} tokens/s | {} steps in {} submits, {:.4} submits per generated token | host CPU {:.1} s{busy}",
        sink.lines.outputs,
        sink.lines.errors,
        args.output.display(),
        stats.generated,
        secs,
        sink.lines.ids.len() as f64 / secs,
        stats.generated as f64 / secs,
        stats.steps,
        stats.submits,
        stats.submits as f64 / stats.generated.max(1) as f64,
        host
    );
    if sink.lines.errors > 0 {
        bail!(
            "{} instance(s) failed (see the error lines in {})",
            sink.lines.errors,
            args.output.display()
        );
    }
    Ok(())
}

/// Reads the task file: one JSON object per line (blank lines skipped), read as the server
/// reads a request's `tasks` ([`TaskSpec`]); the chat template is loaded for the first task
/// given as messages.
fn read_tasks(
    args: &Args,
    gguf: &octoflow_gguf::GgufFile,
    tokenizer: &Tokenizer,
) -> anyhow::Result<Vec<Task>> {
    let file = File::open(&args.tasks)
        .with_context(|| format!("opening the task file {}", args.tasks.display()))?;
    let mut template: Option<ChatTemplate> = None;
    let mut tasks = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let at = || format!("{}:{}", args.tasks.display(), i + 1);
        let line = line.with_context(at)?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(&line).with_context(|| format!("{}: not JSON", at()))?;
        let spec = TaskSpec::from_json(&v, tasks.len()).map_err(|e| anyhow!("{}: {e}", at()))?;
        if spec.needs_template() && template.is_none() {
            template = Some(match &args.chat_template {
                Some(f) => ChatTemplate::from_file_for_model(f, gguf)?,
                None => ChatTemplate::from_gguf(gguf)?,
            });
        }
        let task = spec
            .tokenize(tokenizer, template.as_ref())
            .map_err(|e| match e {
                // As before the shared reader: the line, then the template's own error.
                TaskError::Template(e) => anyhow::Error::new(e).context(at()),
                e => anyhow!("{}: {e}", at()),
            })?;
        tasks.push(task);
    }
    if tasks.is_empty() {
        bail!("{}: no tasks", args.tasks.display());
    }
    Ok(tasks)
}

/// Where outputs go: one JSON line each ([`Lines`]: the shape the server streams), flushed at
/// once (a killed run keeps what it wrote).
struct Sink<'t> {
    out: BufWriter<File>,
    tokenizer: &'t Tokenizer,
    lines: Lines,
}

impl Sink<'_> {
    fn write(&mut self, event: Event) -> anyhow::Result<()> {
        if let Event::Error { instance, message } = &event {
            eprintln!("octoflow agents: instance {instance}: {message}");
        }
        let line = self.lines.line(event, self.tokenizer);
        serde_json::to_writer(&mut self.out, &line)?;
        self.out.write_all(b"\n")?;
        self.out.flush().context("writing the output file")?;
        Ok(())
    }
}

/// What a run did.
struct Stats {
    steps: u64,
    submits: u64,
    generated: u64,
    /// The GPU time of the run's chains (timestamps), where measured.
    gpu_seconds: Option<f64>,
}

/// Steps `program` over `engine` until every instance halted or failed, writing events as they
/// come, with a progress line on stderr.
fn drive(
    engine: &mut dyn BatchForward,
    program: Program,
    config: RunConfig,
    tasks: Vec<Vec<u32>>,
    sink: &mut Sink<'_>,
    pacer: &octoflow_homeo::Pacer,
) -> anyhow::Result<Stats> {
    let mut run = Run::new(program, config, tasks, engine).context("starting the run")?;
    let bar = progress();
    while !run.finished() {
        pacer.before_submit();
        let report = run.step(engine).context("running a step")?;
        let generated = run.generated();
        for event in run.events() {
            sink.write(event)?;
        }
        bar.set_message(format!(
            "step {} | {} live | {} outputs | {generated} tokens",
            report.step + 1,
            report.live,
            sink.lines.outputs
        ));
        bar.tick();
    }
    bar.finish_and_clear();
    Ok(Stats {
        steps: run.steps(),
        submits: run.steps(),
        generated: run.generated(),
        gpu_seconds: None,
    })
}

/// Submits `gpu`'s chain until every instance halted or failed, writing the events of each
/// submit as they come back, with a progress line on stderr.
fn drive_gpu(
    mut gpu: GpuRun<'_>,
    sink: &mut Sink<'_>,
    pacer: &octoflow_homeo::Pacer,
) -> anyhow::Result<Stats> {
    let bar = progress();
    let mut gpu_ns: Option<f64> = Some(0.0);
    while !gpu.finished() {
        pacer.before_submit();
        let report = gpu.submit().context("running the GPU's steps")?;
        gpu_ns = gpu_ns.zip(report.gpu_ns).map(|(a, b)| a + b);
        for event in report.events {
            sink.write(event)?;
        }
        bar.set_message(format!(
            "step {} | {} live | {} outputs | {} tokens",
            report.step, report.live, sink.lines.outputs, report.generated
        ));
        bar.tick();
    }
    bar.finish_and_clear();
    let run = gpu.run();
    if let Some(p) = gpu.profile() {
        eprintln!("{}", super::profile::table(p, run.steps() as usize));
    }
    Ok(Stats {
        steps: run.steps(),
        submits: gpu.submits(),
        generated: run.generated(),
        gpu_seconds: gpu_ns.map(|ns| ns * 1e-9),
    })
}

/// Steps per submit on `g`'s device: as asked, else 16 on a GPU and 0 (the host interprets)
/// on a CPU driver.
fn steps_on(g: &octoflow_model::gpu::GpuModel, asked: Option<u32>) -> u32 {
    asked.unwrap_or(if g.context().caps().kind == octoflow_vk::DeviceKind::Cpu {
        0
    } else {
        16
    })
}

/// The spinner line both drivers show.
fn progress() -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar
}

/// CPU seconds this process has used (user + system); 0 where the platform does not say.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}
