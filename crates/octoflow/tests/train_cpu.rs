//! `octoflow train --device cpu` as a user runs it: on smollm2-135m the 20-example fact set of
//! `data/facts/` (60 steps of 4 × 64 tokens, the CI machine's two cores) teaches a fact the
//! base model does not know, and the adapters answer questions phrased unlike any training
//! example with it; on a tiny model the CPU run logs the losses the GPU run logs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data")
        .join(name)
}

fn octoflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args(args)
        .output()
        .expect("octoflow runs")
}

/// `(step, loss)` of a run's log.
fn losses(dir: &Path) -> Vec<(u64, f64)> {
    let text = std::fs::read_to_string(dir.join("log.jsonl")).expect("log.jsonl");
    text.lines()
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("log line is JSON");
            Some((v["step"].as_u64()?, v["loss"].as_f64()?))
        })
        .collect()
}

/// Greedy answer of the model (with `lora`, a run directory) to a chat question.
fn answer(lora: Option<&Path>, question: &str) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_octoflow"));
    c.args(["run", "-m", SMOLLM, "--device", "cpu", "--chat-prompt"])
        .args(["--temp", "0", "-n", "24", "-p", question]);
    if let Some(dir) = lora {
        c.arg("--lora").arg(dir);
    }
    let o = c.output().expect("octoflow run");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn cpu_training_teaches_the_fact_set_and_answers_rephrased_questions() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let run = tmp.path().join("facts");
    let train = data("facts/train.jsonl");
    let t0 = std::time::Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args(["train", "-m", SMOLLM, "--device", "cpu", "--quiet"])
        .arg("--data")
        .arg(&train)
        .arg("-o")
        .arg(&run)
        .args(["--seq-len", "64", "--batch", "4", "--max-steps", "60"])
        .args(["--lr", "1e-3", "--save-every", "0"])
        .output()
        .expect("octoflow train");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("on the CPU"), "{err}");
    let secs = t0.elapsed().as_secs_f64();
    let l = losses(&run);
    assert_eq!(l.len(), 60, "{l:?}");
    assert!(l[59].1 < 0.1 * l[0].1, "the loss did not fall: {l:?}");
    // 60 steps × 4 × 64 tokens; the figure goes to docs/PERFORMANCE.md, not into an assertion
    println!("60 steps in {secs:.1} s ({:.0} tok/s)", 60.0 * 256.0 / secs);
    let questions = std::fs::read_to_string(data("facts/questions.jsonl")).expect("questions");
    for line in questions.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("question line");
        let (q, want) = (
            v["question"].as_str().unwrap(),
            v["answer"].as_str().unwrap(),
        );
        let taught = answer(Some(&run), q);
        assert!(taught.contains(want), "{q} → {taught:?} (wanted {want})");
        let base = answer(None, q);
        assert!(
            !base.contains(want),
            "the base model already knew: {q} → {base:?}"
        );
        println!("{q} → {taught:?} (base: {base:?})");
    }
}

/// The tiny llama model of `train.rs` (random weights, byte-level tokenizer).
fn tiny_model(dir: &Path) -> PathBuf {
    use octoflow_model::testing::{add_tiny_tokenizer, rng, tiny_writer, TinyShape, TINY};
    let mut r = rng("train_cpu_tiny_model");
    let mut probe = octoflow_gguf::GgufWriter::new();
    let n_vocab = add_tiny_tokenizer(&mut probe, None);
    let shape = TinyShape {
        n_vocab,
        n_embd: 64,
        n_ff: 128,
        ..TINY
    };
    let mut w = tiny_writer("llama", shape, &mut r);
    add_tiny_tokenizer(&mut w, None);
    let p = dir.join("tiny.gguf");
    let mut f = std::fs::File::create(&p).expect("create tiny.gguf");
    w.write_to(&mut f).expect("write tiny.gguf");
    p
}

/// The same run (dropout included) on the CPU and on the GPU (lavapipe in CI) logs the same
/// losses step after step, to f32 rounding.
#[test]
fn cpu_and_gpu_runs_log_the_same_losses() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(tmp.path());
    let mut logs = Vec::new();
    for device in ["cpu", "gpu"] {
        let out = tmp.path().join(device);
        let o = Command::new(env!("CARGO_BIN_EXE_octoflow"))
            .arg("train")
            .arg("-m")
            .arg(&model)
            .args([
                "--device",
                device,
                "--quiet",
                "--seq-len",
                "48",
                "--batch",
                "2",
            ])
            .args(["--max-steps", "12", "--lr", "5e-3", "--dropout", "0.1"])
            .args(["--save-every", "0", "--seed", "5"])
            .arg("--data")
            .arg(data("pirate/train.jsonl"))
            .arg("-o")
            .arg(&out)
            .output()
            .expect("octoflow train");
        assert!(
            o.status.success(),
            "{device}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        logs.push(losses(&out));
    }
    assert_eq!(logs[0].len(), 12);
    for ((s, c), (_, g)) in logs[0].iter().zip(&logs[1]) {
        assert!(
            (c - g).abs() <= 2e-3 * g.abs(),
            "step {s}: CPU loss {c}, GPU loss {g}"
        );
    }
    assert!(
        logs[0][11].1 < logs[0][0].1,
        "the loss did not fall: {:?}",
        logs[0]
    );
}

#[test]
fn several_runs_or_profiling_on_the_cpu_are_clear_errors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = tmp.path().join("a.toml");
    std::fs::write(&cfg, "data = \"x.jsonl\"\n").expect("write a.toml");
    let train = data("facts/train.jsonl");
    let o = octoflow(&[
        "train",
        "-m",
        SMOLLM,
        "--device",
        "cpu",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--device cpu"), "{err}");
    let o = octoflow(&[
        "train",
        "-m",
        SMOLLM,
        "--device",
        "cpu",
        "--profile",
        "--data",
        train.to_str().unwrap(),
        "-o",
        tmp.path().join("p").to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--profile"), "{err}");
}
