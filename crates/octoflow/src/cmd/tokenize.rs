//! `octoflow tokenize -m MODEL TEXT`: the token ids of a text, as llama.cpp's `llama-tokenize`
//! prints them (`id -> 'piece'` per line), or as a list (`--ids`) or JSON (`--json`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use serde_json::json;

/// Arguments of `octoflow tokenize`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: a .gguf path, a Hugging Face folder, a known model name or a URL (default: the default model).
    #[arg(short, long)]
    model: Option<String>,
    /// The text to tokenize.
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    text: Option<String>,
    /// Read the text from a file instead.
    #[arg(short, long)]
    file: Option<PathBuf>,
    /// Print JSON: ids, pieces and the model's tokenizer (with a folder's `tokenizer.json`, which
    /// encodes through the `tokenizers` crate).
    #[arg(long, conflicts_with = "ids")]
    json: bool,
    /// Print only the list of ids.
    #[arg(long)]
    ids: bool,
    /// Do not add BOS/EOS, even where the model adds them.
    #[arg(long)]
    no_bos: bool,
    /// Treat special-token text such as `<|im_start|>` as plain text.
    #[arg(long, alias = "no-parse-special")]
    no_special: bool,
}

/// Runs `octoflow tokenize`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
        (None, None) => anyhow::bail!("give the text to tokenize, or --file"),
    };
    let (path, file) = super::common::open_gguf(args.model.as_deref())?;
    let tokenizer = super::common::tokenizer(&path, &file)
        .with_context(|| format!("tokenizer of {}", path.display()))?;
    let ids = tokenizer.try_encode(&text, !args.no_bos, !args.no_special)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let pieces: Vec<String> = ids
            .iter()
            .map(|&id| String::from_utf8_lossy(tokenizer.token_to_piece(id, true)).into_owned())
            .collect();
        let doc = json!({
            "model": path.display().to_string(),
            "tokenizer": {
                "model": tokenizer.model_name(),
                "pre": tokenizer.pre_name(),
                "tokenizer_json": tokenizer.tokenizer_json().map(|p| p.display().to_string()),
            },
            "n_tokens": ids.len(),
            "ids": ids,
            "pieces": pieces,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else if args.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", "))?;
    } else {
        // Pieces are written as raw bytes: a character split over tokens shows up split.
        for &id in &ids {
            write!(out, "{id:>6} -> '")?;
            out.write_all(tokenizer.token_to_piece(id, true))?;
            writeln!(out, "'")?;
        }
    }
    Ok(())
}
