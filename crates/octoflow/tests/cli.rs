//! The binary as a user runs it: real models, real flags, exit codes and messages.

use std::path::PathBuf;
use std::process::{Command, Output};

fn octoflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args(args)
        .output()
        .expect("the octoflow binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

#[test]
fn inspect_prints_metadata_and_tensors_and_json() {
    let o = octoflow(&["inspect", SMOLLM]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("general.architecture = \"llama\""), "{out}");
    assert!(out.contains("token_embd.weight"), "{out}");
    assert!(out.contains("Q4_1"), "{out}");

    let o = octoflow(&["inspect", SMOLLM, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["metadata"]["llama.block_count"]["value"], 30);
    assert_eq!(doc["tensors"].as_array().unwrap().len(), 272);
    assert_eq!(doc["metadata"]["tokenizer.ggml.tokens"]["len"], 49152);
}

#[test]
fn inspect_of_a_damaged_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0\x01").unwrap();
    let o = octoflow(&["inspect", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("truncated"), "{}", stderr(&o));
    let missing: PathBuf = dir.path().join("nope.gguf");
    let o = octoflow(&["inspect", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!stderr(&o).contains("panicked"));
}

#[test]
fn greedy_run_continues_like_llama_cpp() {
    // ../tests/golden: llama.cpp's greedy continuation starts " Paris.\n\n".
    let o = octoflow(&[
        "run",
        "-m",
        SMOLLM,
        "-p",
        "The capital of France is",
        "-n",
        "4",
        "--temp",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with(" Paris.\n\n"), "{:?}", stdout(&o));
    assert!(stderr(&o).contains("generated: 4 tokens"), "{}", stderr(&o));
}

#[test]
fn same_seed_same_text() {
    let args = [
        "run",
        "-m",
        SMOLLM,
        "-p",
        "Once upon a time",
        "-n",
        "12",
        "--temp",
        "1.0",
        "--seed",
        "42",
    ];
    let a = octoflow(&args);
    let b = octoflow(&args);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(stdout(&a), stdout(&b));
}

#[test]
fn stop_string_ends_generation_without_printing_it() {
    let o = octoflow(&[
        "run",
        "-m",
        SMOLLM,
        "-p",
        "The capital of France is",
        "-n",
        "16",
        "--temp",
        "0",
        "--stop",
        "\n",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        " Paris.\n",
        "the stop string is not printed; run adds one newline"
    );
    assert!(stderr(&o).contains("Stop"));
}

#[test]
fn prompt_longer_than_the_context_is_a_clear_error() {
    let long = "word ".repeat(200);
    let o = octoflow(&["run", "-m", SMOLLM, "-p", &long, "-c", "64", "-n", "4"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("context holds 64"), "{err}");
}

#[test]
fn context_shift_goes_on_past_a_full_context_when_asked() {
    // a prompt longer than the context, and a reply of two contexts (on the CPU reference: the
    // GPU chains' shifts are held to a fresh session in octoflow-generate's tests)
    let long = "word ".repeat(200);
    let args = [
        "run", "-m", SMOLLM, "-p", &long, "-c", "64", "-n", "128", "--temp", "0",
    ];
    let args: Vec<&str> = args
        .into_iter()
        .chain(["--ignore-eos", "--context-shift", "--device", "cpu"])
        .collect();
    for keep in [None, Some("-1")] {
        let mut a = args.clone();
        a.extend(keep.iter().flat_map(|k| ["--keep", *k]));
        let o = octoflow(&a);
        assert!(o.status.success(), "{keep:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("generated: 128 tokens") && err.contains("Length"),
            "{err}"
        );
        let shifts: usize = err
            .split("context shifts: ")
            .nth(1)
            .and_then(|r| r.trim().parse().ok())
            .unwrap_or_else(|| panic!("{keep:?}: no shift count in {err}"));
        assert!(
            shifts >= 4,
            "{keep:?}: {shifts} shifts for 128 tokens in 64: {err}"
        );
    }
    let o = octoflow(&["run", "-m", SMOLLM, "-p", "x", "--keep", "4"]);
    assert_eq!(o.status.code(), Some(2), "--keep needs --context-shift");
    let o = octoflow(&[
        "run",
        "-m",
        SMOLLM,
        "-p",
        "x",
        "--context-shift",
        "--keep",
        "-3",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--keep -3"), "{}", stderr(&o));
}

/// `run --chat` fed `turns` on its standard input, with `extra` flags.
fn chat(turns: &[String], extra: &[&str]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args([
            "run", "-m", SMOLLM, "--chat", "-c", "128", "-n", "12", "--temp", "0",
        ])
        .args(["--ignore-eos", "--device", "cpu"])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the octoflow binary runs");
    let mut input = child.stdin.take().expect("stdin");
    for t in turns {
        writeln!(input, "{t}").expect("a turn written");
    }
    drop(input);
    child.wait_with_output().expect("the chat ends")
}

#[test]
fn a_chat_longer_than_the_context_goes_on_with_context_shift() {
    // five turns of ~30 tokens each with 12-token replies: past 128 positions by the third
    let turns: Vec<String> = (0..5)
        .map(|i| format!("Turn {i}: please remember the words apple river stone cloud {i} and answer briefly."))
        .collect();
    let o = chat(&turns, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("context holds 128"), "{}", stderr(&o));
    let o = chat(&turns, &["--context-shift"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let replies = err.matches("generated: 12 tokens").count();
    assert_eq!(replies, 5, "every turn answered: {err}");
    assert!(err.contains("context shifts: "), "{err}");
}

#[test]
fn bad_sampling_parameters_are_named() {
    let o = octoflow(&["run", "-m", SMOLLM, "-p", "x", "--top-p", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("top_p"), "{}", stderr(&o));
}

#[test]
fn perplexity_reports_mean_nll_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(
        &text,
        "The quick brown fox jumps over the lazy dog. ".repeat(8),
    )
    .unwrap();
    let o = octoflow(&[
        "perplexity",
        "-m",
        SMOLLM,
        "-f",
        text.to_str().unwrap(),
        "--tokens",
        "64",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["n_tokens"], 64);
    let nll = doc["mean_nll"].as_f64().unwrap();
    // A repeated sentence is easy: well under the uniform ln(49152) ≈ 10.8.
    assert!(nll.is_finite() && nll > 0.0 && nll < 3.0, "{nll}");
    assert!((doc["perplexity"].as_f64().unwrap() - nll.exp()).abs() < 1e-6);
}

#[test]
fn greedy_run_on_the_cpu_reference_continues_like_llama_cpp_too() {
    let o = octoflow(&[
        "run",
        "-m",
        SMOLLM,
        "-p",
        "The capital of France is",
        "-n",
        "4",
        "--temp",
        "0",
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with(" Paris.\n\n"), "{:?}", stdout(&o));
    assert!(stderr(&o).contains("CPU reference"), "{}", stderr(&o));
}

#[test]
fn profile_prints_gpu_time_per_kernel() {
    let o = octoflow(&[
        "run",
        "-m",
        SMOLLM,
        "-p",
        "Hello",
        "-n",
        "3",
        "--temp",
        "0",
        "--steps",
        "2",
        "--profile",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for kernel in ["matvec", "q4_1", "attention", "argmax", "advance"] {
        assert!(
            err.contains(kernel),
            "{kernel} missing from the profile:\n{err}"
        );
    }
}

#[test]
fn bench_reports_pp_and_tg_as_json() {
    let o = octoflow(&[
        "bench", "-m", SMOLLM, "-p", "8", "-n", "4", "-r", "2", "--steps", "2", "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tests = doc["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 2);
    assert_eq!(
        (tests[0]["test"].as_str(), tests[1]["test"].as_str()),
        (Some("pp8"), Some("tg4"))
    );
    for t in tests {
        assert_eq!(t["samples_ts"].as_array().unwrap().len(), 2);
        assert!(t["avg_ts"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(doc["backend"], "Vulkan");
}

#[test]
fn bench_with_a_power_target_runs_where_no_sensor_can_pace() {
    // lavapipe and the CPU have no sensor: a notice, pacing off, the tests still measured
    let o = octoflow(&[
        "bench",
        "-m",
        SMOLLM,
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--warmup",
        "0",
        "--steps",
        "2",
        "--power-target",
        "250",
        "--device",
        "cpu",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("pacing off"), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["tests"].as_array().unwrap().len(), 2);
    let o = octoflow(&[
        "bench",
        "-m",
        SMOLLM,
        "--streams",
        "1",
        "--power-target",
        "250",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not --streams"), "{}", stderr(&o));
    let o = octoflow(&["bench", "-m", SMOLLM, "--power-target=-3"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--power-target"), "{}", stderr(&o));
}

#[test]
fn bench_at_depth_runs_each_test_after_that_much_context() {
    let o = octoflow(&[
        "bench",
        "-m",
        SMOLLM,
        "-p",
        "8",
        "-n",
        "4",
        "-d",
        "0,16",
        "-r",
        "1",
        "--warmup",
        "0",
        "--steps",
        "2",
        "--cache-type",
        "f32",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tests = doc["tests"].as_array().unwrap();
    let names: Vec<_> = tests.iter().map(|t| t["test"].as_str().unwrap()).collect();
    // llama-bench's names and order: every test at each depth
    assert_eq!(names, ["pp8", "tg4", "pp8 @ d16", "tg4 @ d16"]);
    let depths: Vec<_> = tests
        .iter()
        .map(|t| t["n_depth"].as_u64().unwrap())
        .collect();
    assert_eq!(depths, [0, 0, 16, 16]);
    assert_eq!(doc["type_kv"], "f32");
    // the context holds the deepest test: 16 + 8 + 4 + 1 positions (the prompt at position 16
    // is only accepted after those 16 tokens were prefilled)
    assert!(stderr(&o).contains("(29 positions, f32)"), "{}", stderr(&o));
}

#[test]
fn the_kv_cache_type_is_f16_by_default_and_a_bad_one_is_named() {
    let o = octoflow(&[
        "bench", "-m", SMOLLM, "-p", "4", "-n", "2", "-r", "1", "--warmup", "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("KV cache: f16"), "{}", stdout(&o));
    assert!(stderr(&o).contains("positions, f16)"), "{}", stderr(&o));
    let o = octoflow(&[
        "run",
        "-m",
        SMOLLM,
        "-p",
        "x",
        "-n",
        "1",
        "--cache-type",
        "q9_9",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("q9_9") && err.contains("f32, f16, q8_0"),
        "{err}"
    );
    // llama.cpp's q8_0 blocks: 36 bytes per 32 values on the GPU, in the memory report too
    let o = octoflow(&[
        "bench",
        "-m",
        SMOLLM,
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "--warmup",
        "0",
        "--cache-type",
        "q8_0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("KV cache: q8_0"), "{}", stdout(&o));
    assert!(stderr(&o).contains("positions, q8_0)"), "{}", stderr(&o));
}

#[test]
fn a_missing_gpu_index_is_a_clear_error() {
    let o = octoflow(&["run", "-m", SMOLLM, "-p", "x", "-n", "1", "--gpu", "99"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("99") && !err.contains("panicked"), "{err}");
}
