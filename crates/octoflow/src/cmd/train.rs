//! `octoflow train`: QLoRA fine-tuning of a GGUF model on the GPU (the base stays in its
//! quantization; LoRA adapters, AdamW state and the training chain live on the device).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use octoflow_model::gpu::GpuModel;
use octoflow_model::Model;
use octoflow_text::{ChatTemplate, Tokenizer};
use octoflow_train::data::load_jsonl;
use octoflow_train::lora::{LoraConfig, Target};
use octoflow_train::run::{train, Observer, RunInputs, StepReport, TrainConfig};
use octoflow_train::schedule::Schedule;
use octoflow_train::{Trainer, TrainerOptions};

/// Arguments of `octoflow train`.
#[derive(clap::Args)]
pub struct Args {
    /// Base model: a .gguf path, a known name or a URL.
    #[arg(short = 'm', long)]
    model: Option<String>,
    /// Training data: JSONL of {"text"}, {"prompt","completion"} or {"messages":[...]} records.
    #[arg(long)]
    data: PathBuf,
    /// Evaluation data (same formats).
    #[arg(long)]
    eval: Option<PathBuf>,
    /// Run directory: checkpoint.gguf, log.jsonl.
    #[arg(short = 'o', long = "output")]
    output: PathBuf,
    /// Continue the run in --output from its last checkpoint (the options must be the same).
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
    /// Passes over the training data.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Stop after this many optimizer steps.
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
    /// Vulkan device index (see `octoflow devices`).
    #[arg(long)]
    gpu: Option<usize>,
    /// No progress bar (one line per step on stderr instead).
    #[arg(long)]
    quiet: bool,
    /// Time every kernel of one micro-step (GPU timestamps), print the table and exit.
    #[arg(long)]
    profile: bool,
}

struct Bar {
    bar: Option<ProgressBar>,
}

impl Observer for Bar {
    fn step(&mut self, r: &StepReport) {
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
            None => eprintln!("step {}/{} {msg}", r.step, r.total_steps),
        }
    }
    fn eval(&mut self, step: u64, loss: f64) {
        self.note(&format!("step {step}: eval loss {loss:.4}"));
    }
    fn note(&mut self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => eprintln!("{msg}"),
        }
    }
}

/// Runs `octoflow train`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let path = super::common::model_path(args.model.as_deref())?;
    let gguf = Arc::new(octoflow_gguf::GgufFile::open(&path)?);
    let tokenizer = Tokenizer::from_gguf(&gguf).context("building the tokenizer")?;
    let template = match &args.chat_template {
        Some(file) => Some(ChatTemplate::from_file_for_model(file, &gguf)?),
        None => ChatTemplate::from_gguf(&gguf).ok(),
    };
    let cfg = TrainConfig {
        lora: LoraConfig {
            rank: args.rank,
            alpha: args.alpha,
            dropout: args.dropout,
            targets: Target::parse_list(&args.targets)?,
        },
        lr: args.lr,
        weight_decay: args.weight_decay,
        schedule: args.schedule.parse::<Schedule>()?,
        warmup: args.warmup,
        epochs: args.epochs,
        max_steps: args.max_steps,
        batch: args.batch,
        grad_accum: args.grad_accum.max(1),
        seq_len: args.seq_len,
        max_grad_norm: args.max_grad_norm,
        seed: args.seed,
        save_every: args.save_every,
        eval_every: args.eval_every,
        beta1: 0.9,
        beta2: 0.999,
        adam_eps: 1e-8,
    };
    cfg.lora.validate()?;
    let train_set = load_jsonl(&args.data, &tokenizer, template.as_ref())?;
    let eval_set = match &args.eval {
        Some(p) => Some(load_jsonl(p, &tokenizer, template.as_ref())?),
        None => None,
    };
    let model = Model::from_gguf(gguf.clone()).context("loading the model")?;
    if args.seq_len > model.config.n_ctx_train {
        anyhow::bail!(
            "--seq-len {} exceeds the model's training context ({})",
            args.seq_len,
            model.config.n_ctx_train
        );
    }
    let choice = args.gpu.map_or(
        octoflow_vk::DeviceChoice::Auto,
        octoflow_vk::DeviceChoice::Index,
    );
    let ctx = octoflow_vk::Context::new(choice).context("opening a Vulkan device")?;
    let gm = GpuModel::load(&ctx, &model).context("loading the model onto the GPU")?;
    let weights = gm.weight_bytes();
    let mut trainer = Trainer::new(
        gm,
        &TrainerOptions {
            batch: cfg.batch,
            seq_len: cfg.seq_len,
            lora: cfg.lora.clone(),
        },
    )
    .context("building the training chain")?;
    let caps = ctx.caps();
    eprintln!(
        "octoflow: train {} on {} ({}) | {} examples{} | {} adapters, {} parameters | weights {:.1} MiB, total {:.1} MiB",
        path.display(),
        caps.name,
        caps.driver_name,
        train_set.len(),
        eval_set.as_ref().map_or(String::new(), |e| format!(" (+{} eval)", e.len())),
        trainer.layout().entries.len(),
        trainer.layout().n_params,
        weights as f64 / (1 << 20) as f64,
        trainer.device_bytes() as f64 / (1 << 20) as f64,
    );
    let pad = tokenizer.special().eos.unwrap_or(0);
    if args.profile {
        let rows = octoflow_train::run::first_rows(&cfg, &train_set, pad)?;
        trainer.micro_step(&rows, 1)?; // warm-up
        let t0 = std::time::Instant::now();
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
    let bar = if args.quiet {
        None
    } else {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "{bar:30} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Some(b)
    };
    let mut obs = Bar { bar };
    let sum = train(
        &mut trainer,
        &cfg,
        &RunInputs {
            train: &train_set,
            eval: eval_set.as_deref(),
            pad,
            run_dir: args.output.clone(),
            resume: args.resume,
        },
        &mut obs,
    )?;
    if let Some(b) = &obs.bar {
        b.finish();
    }
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.4}"));
    eprintln!(
        "octoflow: {} steps | loss {} → {} | eval {} → {} | {:.0} tok/s | peak device memory {:.1} MiB | {}",
        sum.steps,
        f(sum.first_loss),
        f(sum.last_loss),
        f(sum.first_eval),
        f(sum.last_eval),
        sum.tok_per_s,
        sum.peak_device_bytes as f64 / (1 << 20) as f64,
        args.output.display()
    );
    Ok(())
}
