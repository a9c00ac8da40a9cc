//! `octoflow perplexity`: mean negative log-likelihood (nats/token) and perplexity of a text's
//! first N tokens — BOS prepended where the model adds one, every position after the first scored
//! (the quantity `nll.mean_nll` of the golden files).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use serde_json::json;

/// Arguments of `octoflow perplexity`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: a .gguf path, a Hugging Face folder, a known name or a URL (default: the default model).
    #[arg(short = 'm', long)]
    model: Option<String>,
    #[command(flatten)]
    load: super::common::LoadArgs,
    /// The text file to score.
    #[arg(short = 'f', long)]
    file: PathBuf,
    /// Score the first N tokens (BOS included).
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    device: super::common::DeviceArgs,
    #[command(flatten)]
    lora: super::common::LoraArgs,
}

/// Runs `octoflow perplexity`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let path = super::common::model_path(args.model.as_deref())?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let gguf = Arc::new(args.load.open(&path)?);
    let tokenizer = super::common::tokenizer(&path, &gguf)?;
    let config = octoflow_model::ModelConfig::from_gguf(&gguf)?;
    let adapters = args.lora.load(&config)?;
    let mut ids = tokenizer.encode(&text, true, false);
    if args.tokens < 2 {
        bail!("--tokens must be at least 2 (one context token and one scored token)");
    }
    if ids.len() < 2 {
        bail!("{} has fewer than 2 tokens", args.file.display());
    }
    ids.truncate(args.tokens);
    let (model, loaded) = super::common::load_model(gguf, &adapters, &args.device)?;
    let mut session = loaded.session(&model, ids.len(), 1)?;
    let started = std::time::Instant::now();
    let nll = octoflow_model::mean_nll_with(session.as_dyn(), &ids)?;
    let secs = started.elapsed().as_secs_f64();
    let ppl = nll.exp();
    if args.json {
        let doc = json!({
            "model": path.display().to_string(), "file": args.file.display().to_string(),
            "n_tokens": ids.len(), "n_scored": ids.len() - 1, "mean_nll": nll, "perplexity": ppl,
            "seconds": secs,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("tokens: {} (scored {})", ids.len(), ids.len() - 1);
        println!("mean NLL: {nll:.6} nats/token");
        println!("perplexity: {ppl:.4}");
        eprintln!("{:.2} s ({:.1} tok/s)", secs, ids.len() as f64 / secs);
    }
    Ok(())
}
