//! The three real models: each parses, its metadata is what models.toml says, and writing it back
//! reproduces the file byte for byte. The models come from `octoflow pull` (the test command pulls
//! them first); a missing model is a failure with the command to run, not a silent skip.

use std::path::PathBuf;

use octoflow_gguf::{GgufFile, GgufWriter};

fn model(name: &str) -> PathBuf {
    let home = std::env::var_os("OCTOFLOW_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/octoflow")))
        .expect("HOME or OCTOFLOW_HOME must be set");
    let path = home.join("models").join(format!("{name}.gguf"));
    assert!(
        path.exists(),
        "{} is missing: run `octoflow pull {name}`",
        path.display()
    );
    path
}

fn check(name: &str, arch: &str, n_layers: u64) {
    let path = model(name);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), arch);
    assert_eq!(f.get_u64(&format!("{arch}.block_count")).unwrap(), n_layers);
    assert!(f.tensor("token_embd.weight").is_some());
    let mut out = Vec::with_capacity(f.bytes().len());
    GgufWriter::from_file(&f).write_to(&mut out).unwrap();
    assert_eq!(out.len(), f.bytes().len(), "{name}: written size differs");
    let first_diff = out.iter().zip(f.bytes()).position(|(a, b)| a != b);
    assert_eq!(
        first_diff, None,
        "{name}: written file differs from the original"
    );
}

#[test]
fn smollm2_round_trips_byte_identical() {
    check("smollm2-135m-instruct-q4_1", "llama", 30);
}

#[test]
fn qwen2_round_trips_byte_identical() {
    check("qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2", 24);
}

#[test]
fn gemma3_round_trips_byte_identical() {
    check("gemma-3-270m-q4_k_m", "gemma3", 18);
}
