//! `octoflow tokenize` as a user runs it, on a real model: ids agree with llama.cpp's golden file.

use std::process::{Command, Output};

fn octoflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args(args)
        .output()
        .expect("the octoflow binary runs")
}

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";
const GEMMA: &str = "gemma-3-270m-q4_k_m";

#[test]
fn tokenize_prints_ids_and_pieces_like_llama_tokenize() {
    let o = octoflow(&["tokenize", "-m", SMOLLM, "Hello world"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        " 19556 -> 'Hello'\n   905 -> ' world'\n"
    );
}

#[test]
fn tokenize_adds_bos_where_the_model_does_unless_told_not_to() {
    let o = octoflow(&["tokenize", "-m", GEMMA, "--ids", "Hello world"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[2, 9259, 1902]\n");
    let o = octoflow(&["tokenize", "-m", GEMMA, "--ids", "--no-bos", "Hello world"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[9259, 1902]\n");
}

#[test]
fn tokenize_json_parses_special_tokens_unless_no_special() {
    let o = octoflow(&["tokenize", "-m", SMOLLM, "--json", "<|im_start|>user"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON output");
    assert_eq!(doc["ids"], serde_json::json!([1, 4093]));
    assert_eq!(doc["pieces"], serde_json::json!(["<|im_start|>", "user"]));
    assert_eq!(doc["tokenizer"]["pre"], "smollm");
    let o = octoflow(&[
        "tokenize",
        "-m",
        SMOLLM,
        "--json",
        "--no-special",
        "<|im_start|>user",
    ]);
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON output");
    assert!(!doc["ids"]
        .as_array()
        .expect("ids")
        .contains(&serde_json::json!(1)));
}

#[test]
fn tokenize_reads_text_from_a_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("t.txt");
    std::fs::write(&path, "Hello world").expect("write");
    let o = octoflow(&[
        "tokenize",
        "-m",
        SMOLLM,
        "--ids",
        "-f",
        path.to_str().expect("utf-8 path"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "[19556, 905]\n");
}

#[test]
fn tokenize_with_an_unknown_model_fails_naming_it() {
    let o = octoflow(&["tokenize", "-m", "no-such-model", "x"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no-such-model"));
}
