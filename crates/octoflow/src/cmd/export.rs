//! `octoflow export`: a training run's adapters as a llama.cpp LoRA GGUF, or merged into the
//! base model as a complete GGUF (requantized per `--quant`).

use std::path::PathBuf;

use anyhow::Context;
use octoflow_gguf::GgufFile;
use octoflow_model::ModelConfig;
use octoflow_train::export::{adapter_gguf, merged_gguf, MergeQuant};
use octoflow_train::LoraLayout;

/// Arguments of `octoflow export`.
#[derive(clap::Args)]
pub struct Args {
    /// The training run directory (`octoflow train -o DIR`).
    #[arg(long)]
    lora: PathBuf,
    /// The base model the adapters were trained on.
    #[arg(short = 'm', long)]
    model: Option<String>,
    /// Output GGUF.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Write the base model with the adapters merged in instead of the adapter alone.
    #[arg(long)]
    merge: bool,
    /// Type of the merged matrices: same (the base's, requantized), F32, F16, Q8_0, Q4_K, Q5_K, Q6_K.
    #[arg(long, default_value = "same")]
    quant: String,
}

/// Runs `octoflow export`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let path = super::common::model_path(args.model.as_deref())?;
    let base = GgufFile::open(&path)?;
    let config = ModelConfig::from_gguf(&base)?;
    let (cfg, params) = octoflow_train::run::load_adapters(&args.lora)
        .with_context(|| format!("loading adapters from {}", args.lora.display()))?;
    let layout = LoraLayout::new(&cfg.lora, &config);
    if args.merge {
        let quant: MergeQuant = args.quant.parse()?;
        let w = merged_gguf(&base, &layout, &params, quant)?;
        w.write_file(&args.output)?;
        eprintln!(
            "octoflow: {} + {} ({} adapters) merged into {} ({:?})",
            path.display(),
            args.lora.display(),
            layout.entries.len(),
            args.output.display(),
            quant
        );
    } else {
        let w = adapter_gguf(config.arch.name(), &cfg.lora, &layout, &params)?;
        w.write_file(&args.output)?;
        eprintln!(
            "octoflow: LoRA adapter ({} tensors, rank {}, alpha {}) written to {}",
            2 * layout.entries.len(),
            cfg.lora.rank,
            cfg.lora.alpha,
            args.output.display()
        );
    }
    Ok(())
}
