//! `octoflow train`: QLoRA fine-tuning of a GGUF model on the GPU (the base stays in its
//! quantization; LoRA adapters, AdamW state and the training chain live on the device), or
//! with `--device cpu` on the CPU's cores (the same step, `octoflow_train::cpu`).
//!
//! With `--config a.toml --config b.toml` several runs train at once over one upload of the
//! base, each with its own adapters, optimizer state, run directory and log (per-run options
//! in TOML: `train_config.rs`; scheduling: `octoflow_train::run::train_many`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use octoflow_model::gpu::GpuModel;
use octoflow_model::Model;
use octoflow_text::ChatTemplate;
use octoflow_train::data::{load_jsonl, Example};
use octoflow_train::run::{
    train, train_many, Observer, RunInputs, RunSlot, StepReport, Summary, TrainConfig,
};
use octoflow_train::{Backend, CpuTrainer, Trainer, TrainerOptions};

use super::common::Device;
use super::train_config::{self, RunOpts};

/// Arguments of `octoflow train`.
#[derive(clap::Args)]
pub struct Args {
    /// Base model: a .gguf path, a Hugging Face folder, a known name or a URL.
    #[arg(short = 'm', long)]
    model: Option<String>,
    #[command(flatten)]
    load: super::common::LoadArgs,
    /// Training data: JSONL of {"text"}, {"prompt","completion"} or {"messages":[...]} records
    /// (required without --config).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Evaluation data (same formats).
    #[arg(long)]
    eval: Option<PathBuf>,
    /// Run directory: checkpoint.gguf, log.jsonl (required without --config; with --config, a
    /// run file without `output` gets OUTPUT/<file stem>).
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
    /// A run's options as TOML (keys: the long flags' names, `lr = 1e-3`; paths relative to
    /// the file). Repeat to train several runs at once over one copy of the base; the flags
    /// are every run's defaults.
    #[arg(long = "config", value_name = "FILE.toml")]
    config: Vec<PathBuf>,
    /// Continue the run(s) from their last checkpoint (the options must be the same).
    #[arg(long)]
    resume: bool,
    /// LoRA rank.
    #[arg(long, default_value_t = 16)]
    rank: usize,
    /// LoRA alpha (the adapters' output is scaled by alpha / rank).
    #[arg(long, default_value_t = 32.0)]
    alpha: f32,
    /// Dropout on the adapters' input.
    #[arg(long, default_value_t = 0.0)]
    dropout: f32,
    /// Projections that get adapters: q,k,v,o,gate,up,down or all.
    #[arg(long, default_value = "q,k,v,o,gate,up,down")]
    targets: String,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-4)]
    lr: f32,
    /// Decoupled weight decay (AdamW).
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f32,
    /// Learning-rate schedule: cosine, linear or constant.
    #[arg(long, default_value = "cosine")]
    schedule: String,
    /// Warm-up steps.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// Passes over the training data (ignored with --max-steps).
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Train exactly this many optimizer steps, overriding --epochs (as Hugging Face's
    /// max_steps does): the data is gone through as many times as needed, reshuffled each pass,
    /// and the learning-rate schedule spans these steps.
    #[arg(long)]
    max_steps: Option<u64>,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Tokens per sequence (short examples are packed together).
    #[arg(long, default_value_t = 512)]
    seq_len: usize,
    /// Global gradient-norm clipping (0: off).
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f32,
    /// Seed of the adapters' initialization, the shuffling and dropout.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = 100)]
    save_every: u64,
    /// Evaluate every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    eval_every: u64,
    /// A Jinja chat template file for {"messages"} records (default: the model's).
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Where to train: the Vulkan GPU, or the CPU's cores (`cpu`: the same step, multithreaded,
    /// the base dequantized to f32 in memory; one run at a time).
    #[arg(long, value_enum, default_value_t = Device::Gpu)]
    device: Device,
    /// Vulkan device index (see `octoflow devices`).
    #[arg(long)]
    gpu: Option<usize>,
    /// No progress bar (one line per step on stderr instead).
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    homeo: super::homeo::HomeoArgs,
    /// Time every kernel of one micro-step (GPU timestamps), print the table and exit.
    #[arg(long)]
    profile: bool,
}

impl Args {
    /// The per-run options the flags give (every `--config` file's defaults).
    fn run_opts(&self) -> RunOpts {
        RunOpts {
            name: "train".into(),
            data: self.data.clone(),
            eval: self.eval.clone(),
            output: self.output.clone(),
            rank: self.rank,
            alpha: self.alpha,
            dropout: self.dropout,
            targets: self.targets.clone(),
            lr: self.lr,
            weight_decay: self.weight_decay,
            schedule: self.schedule.clone(),
            warmup: self.warmup,
            epochs: self.epochs,
            max_steps: self.max_steps,
            batch: self.batch,
            grad_accum: self.grad_accum,
            seq_len: self.seq_len,
            max_grad_norm: self.max_grad_norm,
            seed: self.seed,
            save_every: self.save_every,
            eval_every: self.eval_every,
        }
    }
}

/// Progress of one run: a bar (or lines on stderr with `--quiet`), and the tokens it trained.
struct Bar {
    bar: Option<ProgressBar>,
    /// `[name] ` before quiet lines when several runs share stderr.
    tag: String,
    tokens: u64,
    /// Holds the GPU under the temperature/power targets: the delay goes between steps.
    pacer: octoflow_homeo::Pacer,
}

impl Observer for Bar {
    fn step(&mut self, r: &StepReport) {
        self.pacer.before_submit();
        self.tokens += r.tokens;
        let msg = format!(
            "loss {:.4} | lr {:.2e} | |g| {:.3} | {:.0} tok/s",
            r.loss, r.lr, r.grad_norm, r.tok_per_s
        );
        match &self.bar {
            Some(b) => {
                b.set_length(r.total_steps);
                b.set_position(r.step);
                b.set_message(msg);
            }
            None => eprintln!("{}step {}/{} {msg}", self.tag, r.step, r.total_steps),
        }
    }
    fn eval(&mut self, step: u64, loss: f64) {
        self.note(&format!("step {step}: eval loss {loss:.4}"));
    }
    fn note(&mut self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(format!("{}{msg}", self.tag)),
            None => eprintln!("{}{msg}", self.tag),
        }
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

/// One summary line.
fn summary_line(s: &Summary) -> String {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    format!(
        "{} steps | loss {} → {} | eval {} → {} | {:.0} tok/s",
        s.steps,
        f(s.first_loss),
        f(s.last_loss),
        f(s.first_eval),
        f(s.last_eval),
        s.tok_per_s
    )
}

/// A run's options, data and training config, checked before the model is loaded.
struct Prepared {
    opts: RunOpts,
    cfg: TrainConfig,
    train: Vec<Example>,
    eval: Option<Vec<Example>>,
}

/// Runs `octoflow train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let path = super::common::model_path(args.model.as_deref())?;
    let gguf = Arc::new(args.load.open(&path)?);
    let tokenizer = super::common::tokenizer(&path, &gguf)?;
    let template = match &args.chat_template {
        Some(file) => Some(ChatTemplate::from_file_for_model(file, &gguf)?),
        None => ChatTemplate::from_gguf(&gguf).ok(),
    };
    let multi = !args.config.is_empty();
    if args.device == Device::Cpu && multi {
        anyhow::bail!(
            "--device cpu trains one run at a time: several runs at once (--config) need the GPU"
        );
    }
    if args.device == Device::Cpu && args.profile {
        anyhow::bail!("--profile times the GPU's kernels: it does not apply to --device cpu");
    }
    if multi && args.profile {
        anyhow::bail!("--profile times a single run: use it without --config");
    }
    let defaults = args.run_opts();
    let runs: Vec<RunOpts> = if multi {
        args.config
            .iter()
            .map(|p| train_config::load(p, &defaults))
            .collect::<anyhow::Result<_>>()?
    } else {
        if args.data.is_none() || args.output.is_none() {
            anyhow::bail!("--data and --output are required (or give runs with --config FILE)");
        }
        vec![defaults]
    };
    let mut prepared = Vec::with_capacity(runs.len());
    for opts in runs {
        let name = opts.name.clone();
        let p = (|| -> anyhow::Result<Prepared> {
            let cfg = opts.to_config()?;
            opts.output()?;
            let train = load_jsonl(opts.data()?, &tokenizer, template.as_ref())?;
            let eval = match &opts.eval {
                Some(p) => Some(load_jsonl(p, &tokenizer, template.as_ref())?),
                None => None,
            };
            Ok(Prepared {
                opts,
                cfg,
                train,
                eval,
            })
        })();
        prepared.push(if multi {
            p.with_context(|| format!("run {name}"))?
        } else {
            p?
        });
    }
    for (i, a) in prepared.iter().enumerate() {
        if let Some(b) = prepared[..i]
            .iter()
            .find(|b| b.opts.output == a.opts.output)
        {
            anyhow::bail!(
                "runs {} and {} both write to {}: give each its own output",
                b.opts.name,
                a.opts.name,
                a.opts.output()?.display()
            );
        }
    }
    let model = Model::from_gguf(gguf.clone()).context("loading the model")?;
    for p in &prepared {
        if p.cfg.seq_len > model.config.n_ctx_train {
            anyhow::bail!(
                "{}--seq-len {} exceeds the model's training context ({})",
                if multi {
                    format!("run {}: ", p.opts.name)
                } else {
                    String::new()
                },
                p.cfg.seq_len,
                model.config.n_ctx_train
            );
        }
    }
    let pad = tokenizer.special().eos.unwrap_or(0);
    if args.device == Device::Cpu {
        return run_cpu(&args, &path, &model, &prepared[0], pad);
    }
    let ctx = super::warm::open_device(args.gpu)?;
    let pacer = args.homeo.start(Some(ctx.caps()), "octoflow train")?;
    let gm = Arc::new(GpuModel::load(&ctx, &model).context("loading the model onto the GPU")?);
    let weights = gm.weight_bytes();
    let opts: Vec<TrainerOptions> = prepared
        .iter()
        .map(|p| TrainerOptions {
            batch: p.cfg.batch,
            seq_len: p.cfg.seq_len,
            lora: p.cfg.lora.clone(),
        })
        .collect();
    // several runs are the members of one trainer: one chain per micro-step over all of them
    let mut trainer = Trainer::joint(gm.clone(), &opts).context("building the training chain")?;
    // on tensor cores the input gradients go through f16 copies of Wᵀ (the forward's product
    // kernel) instead of the plain kernel over the quantized weights
    if trainer.uses_coop() {
        let t0 = Instant::now();
        match octoflow_train::TransposedWeights::build(&ctx, &model) {
            Ok(t) => {
                eprintln!(
                    "octoflow: input gradients on tensor cores: f16 copies of the transposed weights, {:.1} MiB (made in {:.1} s)",
                    mib(t.bytes()),
                    t0.elapsed().as_secs_f64()
                );
                trainer.set_transposed(Some(Arc::new(t)))?;
            }
            Err(e) => eprintln!(
                "octoflow: input gradients through the quantized weights (no room for f16 copies: {e})"
            ),
        }
    }
    super::warm::save_pipelines(&ctx); // the training chains are recorded: every pipeline is built
    let caps = ctx.caps();
    if multi {
        eprintln!(
            "octoflow: train {} on {} ({}) | {} runs over one copy of the weights, one chain, {} rows a micro-step | weights {:.1} MiB + runs {:.1} MiB",
            path.display(),
            caps.name,
            caps.driver_name,
            prepared.len(),
            trainer.stacked_rows(),
            mib(weights),
            mib(trainer.state_bytes()),
        );
        for (g, p) in prepared.iter().enumerate() {
            eprintln!(
                "  {}: {} examples{} | rank {} | {} parameters | {}",
                p.opts.name,
                p.train.len(),
                p.eval
                    .as_ref()
                    .map_or(String::new(), |e| format!(" (+{} eval)", e.len())),
                p.cfg.lora.rank,
                trainer.layout_of(g)?.n_params,
                p.opts.output()?.display()
            );
        }
    } else {
        let p = &prepared[0];
        eprintln!(
            "octoflow: train {} on {} ({}) | {} examples{} | {} adapters, {} parameters | weights {:.1} MiB, total {:.1} MiB",
            path.display(),
            caps.name,
            caps.driver_name,
            p.train.len(),
            p.eval.as_ref().map_or(String::new(), |e| format!(" (+{} eval)", e.len())),
            trainer.layout().entries.len(),
            trainer.layout().n_params,
            mib(weights),
            mib(trainer.device_bytes()),
        );
    }
    if args.profile {
        let p = &prepared[0];
        let rows = octoflow_train::run::first_rows(&p.cfg, &p.train, pad)?;
        trainer.micro_step(&rows, 1)?; // warm-up
        let t0 = Instant::now();
        trainer.micro_step(&rows, 1)?;
        let wall = t0.elapsed().as_secs_f64();
        let prof = trainer.profile_step(&rows, 1)?;
        let total: f64 = prof.iter().map(|l| l.total_ns).sum();
        eprintln!(
            "one micro-step of {} rows: wall {:.1} ms ({:.0} tok/s), GPU time {:.1} ms",
            trainer.rows(),
            wall * 1e3,
            trainer.rows() as f64 / wall,
            total / 1e6
        );
        eprintln!("{:>10} {:>7} {:>6}  kernel", "ms", "calls", "%");
        for l in &prof {
            eprintln!(
                "{:>10.3} {:>7} {:>5.1}%  {}",
                l.total_ns / 1e6,
                l.count,
                100.0 * l.total_ns / total,
                l.label
            );
        }
        return Ok(());
    }
    let inputs: Vec<RunInputs> = prepared
        .iter()
        .map(|p| {
            Ok(RunInputs {
                train: &p.train,
                eval: p.eval.as_deref(),
                pad,
                run_dir: p.opts.output()?.to_path_buf(),
                resume: args.resume,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    if !multi {
        let p = &prepared[0];
        return train_one(
            &mut trainer,
            p,
            &inputs[0],
            args.quiet,
            pacer,
            "peak device memory",
        );
    }
    let mp = MultiProgress::new();
    let mut observers: Vec<Bar> = prepared
        .iter()
        .map(|p| {
            let bar = (!args.quiet).then(|| {
                let b = mp.add(ProgressBar::new(0));
                b.set_style(bar_style(true));
                b.set_prefix(p.opts.name.clone());
                b
            });
            Bar {
                tag: if bar.is_some() {
                    String::new()
                } else {
                    format!("[{}] ", p.opts.name)
                },
                bar,
                tokens: 0,
                pacer: pacer.clone(),
            }
        })
        .collect();
    let slots: Vec<RunSlot> = prepared
        .iter()
        .zip(&inputs)
        .zip(observers.iter_mut())
        .map(|((p, inputs), observer)| RunSlot {
            cfg: &p.cfg,
            inputs,
            observer,
        })
        .collect();
    let t0 = Instant::now();
    let sums = train_many(&mut trainer, slots)?;
    let wall = t0.elapsed().as_secs_f64();
    for o in &observers {
        if let Some(b) = &o.bar {
            b.finish();
        }
    }
    for ((p, s), i) in prepared.iter().zip(&sums).zip(&inputs) {
        eprintln!(
            "octoflow: {}: {} | {}",
            p.opts.name,
            summary_line(s),
            i.run_dir.display()
        );
    }
    let tokens: u64 = observers.iter().map(|o| o.tokens).sum();
    let state = trainer.state_bytes();
    let measured = sums.iter().map(|s| s.peak_device_bytes).max().unwrap_or(0);
    eprintln!(
        "octoflow: {} runs | {tokens} tokens in {wall:.1} s: {:.0} tok/s together | peak device memory {:.1} MiB = weights {:.1} MiB (once) + runs {:.1} MiB (measured {:.1} MiB)",
        sums.len(),
        tokens as f64 / wall.max(1e-9),
        mib(weights + state),
        mib(weights),
        mib(state),
        mib(measured),
    );
    Ok(())
}

/// The progress bar's style (`multi`: prefixed with the run's name).
fn bar_style(multi: bool) -> ProgressStyle {
    let prefix = if multi { "{prefix:>12} " } else { "" };
    ProgressStyle::with_template(&format!(
        "{prefix}{{bar:30}} {{pos}}/{{len}} [{{elapsed_precise}}<{{eta_precise}}] {{msg}}"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// Trains one run on `t` with a progress bar (or lines with `quiet`) and prints its summary;
/// `memory` names the peak memory figure.
fn train_one(
    t: &mut dyn Backend,
    p: &Prepared,
    inputs: &RunInputs,
    quiet: bool,
    pacer: octoflow_homeo::Pacer,
    memory: &str,
) -> anyhow::Result<()> {
    let bar = (!quiet).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(bar_style(false));
        b
    });
    let mut obs = Bar {
        bar,
        tag: String::new(),
        tokens: 0,
        pacer,
    };
    let sum = train(t, &p.cfg, inputs, &mut obs)?;
    if let Some(b) = &obs.bar {
        b.finish();
    }
    eprintln!(
        "octoflow: {} | {memory} {:.1} MiB | {}",
        summary_line(&sum),
        mib(sum.peak_device_bytes),
        inputs.run_dir.display()
    );
    Ok(())
}

/// `--device cpu`: one run on the CPU's cores.
fn run_cpu(args: &Args, path: &Path, model: &Model, p: &Prepared, pad: u32) -> anyhow::Result<()> {
    let pacer = if args.homeo.targets()?.any() {
        args.homeo.start(None, "octoflow train")?
    } else {
        octoflow_homeo::Pacer::off()
    };
    let opts = TrainerOptions {
        batch: p.cfg.batch,
        seq_len: p.cfg.seq_len,
        lora: p.cfg.lora.clone(),
    };
    let t0 = Instant::now();
    let mut trainer = CpuTrainer::new(model, &opts).context("setting up the CPU training step")?;
    eprintln!(
        "octoflow: train {} on the CPU ({} threads) | {} examples{} | {} adapters, {} parameters | memory {:.1} MiB (weights dequantized in {:.1} s)",
        path.display(),
        trainer.threads(),
        p.train.len(),
        p.eval.as_ref().map_or(String::new(), |e| format!(" (+{} eval)", e.len())),
        trainer.layout().entries.len(),
        trainer.layout().n_params,
        mib(trainer.memory_bytes()),
        t0.elapsed().as_secs_f64(),
    );
    let inputs = RunInputs {
        train: &p.train,
        eval: p.eval.as_deref(),
        pad,
        run_dir: p.opts.output()?.to_path_buf(),
        resume: args.resume,
    };
    train_one(&mut trainer, p, &inputs, args.quiet, pacer, "peak memory")
}
