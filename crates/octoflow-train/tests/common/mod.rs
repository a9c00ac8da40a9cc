//! Test support: a tiny in-memory SentencePiece tokenizer with ChatML specials, a ChatML
//! template, and the real models of the cache (`$OCTOFLOW_HOME/models`, default
//! `~/.cache/octoflow`), which tests skip with a note when absent.

#![allow(dead_code)]

use std::path::PathBuf;

use octoflow_gguf::{GgufFile, GgufWriter, Value};
use octoflow_text::{ChatTemplate, Tokenizer};

/// ChatML, as SmolLM2 and Qwen write it (without a default system message).
pub const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A SentencePiece (`llama`) tokenizer of `<unk> <s> </s> <|im_start|> <|im_end|>`, the 256
/// byte tokens and a few words, with BOS added and no space prefix.
pub fn tiny_tokenizer() -> Tokenizer {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    octoflow_model::testing::add_tiny_tokenizer(&mut w, None);
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).expect("writing the tiny tokenizer");
    let file = GgufFile::from_bytes(bytes).expect("parsing the tiny tokenizer");
    Tokenizer::from_gguf(&file).expect("building the tiny tokenizer")
}

/// The ChatML template with the tiny tokenizer's BOS/EOS texts.
pub fn chatml() -> ChatTemplate {
    ChatTemplate::from_source(CHATML, "test ChatML", "<s>", "</s>").expect("ChatML compiles")
}

/// A cached model's file, or `None` (with a note) when it is not in the cache.
pub fn cached_model(name: &str) -> Option<GgufFile> {
    let home = std::env::var_os("OCTOFLOW_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/octoflow")))?;
    let path = home.join("models").join(format!("{name}.gguf"));
    if !path.is_file() {
        eprintln!(
            "note: skipping: model {name} is not in the cache ({}); `octoflow pull` it",
            path.display()
        );
        return None;
    }
    Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The real models the data tests run on.
pub const MODELS: [&str; 2] = [
    "smollm2-135m-instruct-q4_1",
    "qwen2.5-coder-0.5b-instruct-q4_k_m",
];

/// Writes `lines` (joined by newlines) to a temp file.
pub fn jsonl(dir: &tempfile::TempDir, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, lines.join("\n") + "\n").expect("writing test data");
    path
}
