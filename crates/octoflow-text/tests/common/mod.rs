//! Shared by the real-model tests: finding the cached models and reading the golden files.

#![allow(dead_code)]

use std::path::PathBuf;

use octoflow_gguf::GgufFile;
use octoflow_text::Tokenizer;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::Value;

/// The three models the golden files describe.
pub const MODELS: [&str; 3] = [
    "smollm2-135m-instruct-q4_1",
    "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "gemma-3-270m-q4_k_m",
];

/// `$OCTOFLOW_HOME/models/<name>.gguf` (default home `~/.cache/octoflow`); a missing model fails
/// the test with the command that fetches it.
pub fn model_path(name: &str) -> PathBuf {
    let home = std::env::var_os("OCTOFLOW_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("neither OCTOFLOW_HOME nor HOME is set");
            PathBuf::from(home).join(".cache/octoflow")
        });
    let path = home.join("models").join(format!("{name}.gguf"));
    assert!(
        path.is_file(),
        "model {name} is not in the cache ({}): run `octoflow pull {name}` first",
        path.display()
    );
    path
}

pub fn open_model(name: &str) -> GgufFile {
    let path = model_path(name);
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn tokenizer(name: &str) -> Tokenizer {
    Tokenizer::from_gguf(&open_model(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The golden file of a model (llama.cpp's outputs), from the workspace's `tests/golden/`.
pub fn golden(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/golden")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of token ids")
        .iter()
        .map(|x| x.as_u64().expect("a token id") as u32)
        .collect()
}

pub fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("golden field {key:?} is not a string"))
}

/// The seed of a randomized test: `OCTOFLOW_TEST_SEED`, or a fresh one (print it on failure).
pub fn seed() -> u64 {
    std::env::var("OCTOFLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

/// A random character, drawn from pools that stress different paths: ASCII words and
/// punctuation, white space runs, digits, accented Latin, combining marks, CJK, Hangul, emoji
/// (4-byte UTF-8), and any scalar value at all.
pub fn random_char(rng: &mut StdRng) -> char {
    const POOLS: &[&str] = &[
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "     \t\n\r\n",
        "0123456789",
        ".,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`",
        "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßẞΩЖж",
        "\u{300}\u{301}\u{308}\u{327}\u{200d}\u{fe0f}",
        "日本語のテキスト中文字符",
        "한국어텍스트",
        "🚀🔥👍🏽😀🎉🧪",
        "\u{a0}\u{2003}\u{3000}\u{85}\u{0}\u{7f}",
    ];
    if rng.gen_bool(0.1) {
        loop {
            if let Some(c) = char::from_u32(rng.gen_range(0..0x11_0000)) {
                return c;
            }
        }
    }
    let pool: Vec<char> = POOLS[rng.gen_range(0..POOLS.len())].chars().collect();
    pool[rng.gen_range(0..pool.len())]
}
