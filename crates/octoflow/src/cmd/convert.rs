//! `octoflow convert`: a Hugging Face folder written as the GGUF llama.cpp's converter produces
//! (its tensor names, metadata keys and tokenizer metadata), optionally quantized.

use std::path::PathBuf;

use octoflow_train::export::MergeQuant;

/// Arguments of `octoflow convert`.
#[derive(clap::Args)]
pub struct Args {
    /// The Hugging Face folder (config.json, *.safetensors, tokenizer.json).
    folder: PathBuf,
    /// Output GGUF.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Type of the matrices: same (as stored: F32, F16 or BF16), F32, F16, Q8_0, Q4_K, Q5_K, Q6_K.
    #[arg(long, default_value = "same")]
    quant: String,
}

/// Runs `octoflow convert`.
pub fn run(args: Args) -> anyhow::Result<()> {
    // the same names and parser as `export --merge --quant`
    let quant = match args.quant.parse::<MergeQuant>()? {
        MergeQuant::Same => None,
        MergeQuant::To(ty) => Some(ty),
    };
    let folder = octoflow_hf::HfFolder::open(&args.folder)?;
    let w = folder.writer_as(quant)?;
    w.write_file(&args.output)?;
    eprintln!(
        "octoflow: {} ({}, {} tensors) converted into {}",
        args.folder.display(),
        folder.config().family.arch(),
        w.tensors().len(),
        args.output.display()
    );
    Ok(())
}
