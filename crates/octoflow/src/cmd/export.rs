//! `octoflow export`: a training run's adapters as a llama.cpp LoRA GGUF or a PEFT adapter folder
//! (`--peft`), or merged into the base model as a complete GGUF (requantized per `--quant`).

use std::path::PathBuf;

use octoflow_model::ModelConfig;
use octoflow_train::export::{adapter_gguf, merged_gguf, MergeQuant};

/// Arguments of `octoflow export`.
#[derive(clap::Args)]
pub struct Args {
    /// The adapters: a training run directory (`octoflow train -o DIR`), an adapter GGUF or a
    /// PEFT adapter folder.
    #[arg(long)]
    lora: PathBuf,
    /// The base model the adapters were trained on.
    #[arg(short = 'm', long)]
    model: Option<String>,
    /// Output GGUF (a folder with `--peft`).
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Write the base model with the adapters merged in instead of the adapter alone.
    #[arg(long, conflicts_with = "peft")]
    merge: bool,
    /// Write the adapter as a PEFT folder (adapter_config.json, adapter_model.safetensors) that
    /// Hugging Face's peft loads onto the base's transformers model.
    #[arg(long)]
    peft: bool,
    /// Type of the merged matrices: same (the base's, requantized), F32, F16, Q8_0, Q4_K, Q5_K, Q6_K.
    #[arg(long, default_value = "same")]
    quant: String,
}

/// Runs `octoflow export`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let path = super::common::model_path(args.model.as_deref())?;
    let base = super::common::open_model(&path)?;
    let config = ModelConfig::from_gguf(&base)?;
    let adapter = super::common::load_adapter(&args.lora, &config)?;
    if args.merge {
        let quant: MergeQuant = args.quant.parse()?;
        let w = merged_gguf(&base, &[(&adapter, 1.0)], quant)?;
        w.write_file(&args.output)?;
        eprintln!(
            "octoflow: {} + {} ({} projections) merged into {} ({:?})",
            path.display(),
            args.lora.display(),
            adapter.tensors.len(),
            args.output.display(),
            quant
        );
    } else if args.peft {
        let mut bytes = Vec::new();
        adapter_gguf(config.arch.name(), &adapter)?.write_to(&mut bytes)?;
        let file = octoflow_gguf::GgufFile::from_bytes(bytes)?;
        let base_name = args.model.as_deref().unwrap_or(config.arch.name());
        let base = super::common::peft_base(&config);
        octoflow_hf::peft::write(&file, &base, base_name, &args.output)?;
        eprintln!(
            "octoflow: LoRA adapter ({} projections, alpha {}) written as a PEFT folder {}",
            adapter.tensors.len(),
            adapter.alpha,
            args.output.display()
        );
    } else {
        let w = adapter_gguf(config.arch.name(), &adapter)?;
        w.write_file(&args.output)?;
        eprintln!(
            "octoflow: LoRA adapter ({} tensors, alpha {}) written to {}",
            2 * adapter.tensors.len(),
            adapter.alpha,
            args.output.display()
        );
    }
    Ok(())
}
