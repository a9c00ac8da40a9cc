//! `octoflow train` as a user runs it, on a tiny random llama model with a byte-level
//! SentencePiece tokenizer and a ChatML template (a real model takes minutes per step on
//! lavapipe; the real-model runs are on the H100, docs/PERFORMANCE.md) and the pirate dataset of
//! `data/pirate/`: the training and eval losses fall; a run killed with SIGKILL after a checkpoint
//! and resumed logs the same losses as an uninterrupted run; `octoflow run --lora` loads the
//! result.
//!
//! `--device cpu`: on smollm2-135m the 20-example fact set of `data/facts/` (60 steps of 4 × 64
//! tokens, the CI machine's two cores) teaches a fact the base model does not know, and the
//! adapters answer questions phrased unlike any training example with it; on the tiny model
//! the CPU run logs the losses the GPU run logs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Writes the tiny model into `dir` and returns its path.
fn tiny_model(dir: &Path) -> PathBuf {
    use octoflow_model::testing::{add_tiny_tokenizer, rng, tiny_writer, TinyShape, TINY};
    let mut r = rng("train_cli_tiny_model");
    // the tokenizer's size first, then random weights of that vocabulary
    let mut probe = octoflow_gguf::GgufWriter::new();
    let n_vocab = add_tiny_tokenizer(&mut probe, None);
    let shape = TinyShape {
        n_vocab,
        n_embd: 64,
        n_ff: 128,
        ..TINY
    };
    let mut w = tiny_writer("llama", shape, &mut r);
    add_tiny_tokenizer(&mut w, Some(CHATML));
    let p = dir.join("tiny.gguf");
    let mut f = std::fs::File::create(&p).expect("create tiny.gguf");
    w.write_to(&mut f).expect("write tiny.gguf");
    p
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/pirate")
        .join(name)
}

/// The first `n` records of the eval set (a short eval keeps the test quick on lavapipe).
fn short_eval(dir: &Path, n: usize) -> PathBuf {
    let text = std::fs::read_to_string(data("eval.jsonl")).expect("eval.jsonl");
    let p = dir.join("eval-short.jsonl");
    let lines: Vec<&str> = text.lines().take(n).collect();
    std::fs::write(&p, lines.join("\n") + "\n").expect("write eval");
    p
}

const STEPS: u64 = 30;

fn train_cmd(model: &Path, out: &Path, eval: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_octoflow"));
    c.arg("train")
        .arg("-m")
        .arg(model)
        .args([
            "--quiet",
            "--seq-len",
            "128",
            "--batch",
            "2",
            "--dropout",
            "0.05",
        ])
        .args([
            "--max-steps",
            &STEPS.to_string(),
            "--lr",
            "1e-2",
            "--warmup",
            "3",
        ])
        .args(["--save-every", "4", "--eval-every", "10", "--seed", "7"])
        .arg("--data")
        .arg(data("train.jsonl"))
        .arg("--eval")
        .arg(eval)
        .arg("-o")
        .arg(out)
        .args(extra)
        .stdout(Stdio::null());
    c
}

/// `(step, loss)` and `(step, eval_loss)` lines of a run's log.
/// `(step, value)` pairs.
type Series = Vec<(u64, f64)>;

fn log(dir: &Path) -> (Series, Series) {
    let text = std::fs::read_to_string(dir.join("log.jsonl")).unwrap_or_default();
    let (mut train, mut eval) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("log line is JSON");
        let step = v["step"].as_u64().expect("step");
        if let Some(l) = v["loss"].as_f64() {
            train.push((step, l));
        }
        if let Some(l) = v["eval_loss"].as_f64() {
            eval.push((step, l));
        }
    }
    (train, eval)
}

#[test]
fn train_learns_resumes_after_sigkill_and_run_loads_the_adapters() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(tmp.path());
    let eval = short_eval(tmp.path(), 6);
    // 1. uninterrupted
    let a = tmp.path().join("a");
    let st = train_cmd(&model, &a, &eval, &[])
        .status()
        .expect("train runs");
    assert!(st.success(), "octoflow train failed");
    let (ta, ea) = log(&a);
    assert_eq!(
        ta.iter().map(|x| x.0).collect::<Vec<_>>(),
        (1..=STEPS).collect::<Vec<_>>()
    );
    let n = ta.len();
    let first = (ta[0].1 + ta[1].1) / 2.0;
    let last = (ta[n - 2].1 + ta[n - 1].1) / 2.0;
    assert!(last < 0.9 * first, "training loss did not fall: {ta:?}");
    let (e0, e1) = (ea.first().expect("eval").1, ea.last().expect("eval").1);
    assert!(e1 < e0, "eval loss did not fall: {ea:?}");
    println!("train loss {first:.4} → {last:.4}, eval loss {e0:.4} → {e1:.4}");

    // 2. killed after a checkpoint (at a step past it), then resumed
    let b = tmp.path().join("b");
    let mut child = train_cmd(&model, &b, &eval, &[])
        .spawn()
        .expect("train starts");
    let t0 = Instant::now();
    loop {
        let (tb, _) = log(&b);
        if b.join("checkpoint.gguf").exists() && tb.iter().any(|x| x.0 >= 5) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(900),
            "no checkpoint in time"
        );
        if let Ok(Some(st)) = child.try_wait() {
            panic!("train ended before it could be killed: {st}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    let st = train_cmd(&model, &b, &eval, &["--resume"])
        .status()
        .expect("resume runs");
    assert!(st.success(), "octoflow train --resume failed");
    let (tb, _) = log(&b);
    assert_eq!(tb.len(), ta.len(), "resumed log: {tb:?}");
    for ((sa, la), (sb, lb)) in ta.iter().zip(&tb) {
        assert_eq!(sa, sb);
        assert!(
            (la - lb).abs() <= 1e-5 * la.abs(),
            "step {sa}: {la} vs resumed {lb}"
        );
    }

    // 3. run --lora loads the adapters and generates
    let out = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .arg("run")
        .arg("-m")
        .arg(&model)
        .args(["--temp", "0", "-n", "4", "--chat-prompt"])
        .args(["-p", "What is the capital of Chile?", "--lora"])
        .arg(&a)
        .output()
        .expect("run --lora");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("LoRA") && err.contains("at scale 1"), "{err}");
    // 4. export: a llama.cpp LoRA adapter GGUF and a merged model
    let adapter = tmp.path().join("adapter.gguf");
    let merged = tmp.path().join("merged.gguf");
    for (extra, out) in [
        (&[][..], &adapter),
        (&["--merge", "--quant", "same"][..], &merged),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_octoflow"))
            .arg("export")
            .arg("--lora")
            .arg(&a)
            .arg("-m")
            .arg(&model)
            .arg("-o")
            .arg(out)
            .args(extra)
            .output()
            .expect("export runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .arg("inspect")
        .arg(&adapter)
        .arg("--json")
        .output()
        .expect("inspect runs");
    let doc = String::from_utf8_lossy(&o.stdout);
    assert!(
        doc.contains("adapter.lora.alpha") && doc.contains("blk.0.attn_q.weight.lora_a"),
        "{doc}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .arg("run")
        .arg("-m")
        .arg(&merged)
        .args(["--temp", "0", "-n", "2", "-p", "Arr"])
        .output()
        .expect("merged model runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // a directory without a checkpoint is a clear error
    let out = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .arg("run")
        .arg("-m")
        .arg(&model)
        .args(["-n", "1", "-p", "x", "--lora"])
        .arg(tmp.path())
        .output()
        .expect("run --lora");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("checkpoint"), "{err}");
}

/// Writes lines `range` of the training set to `dir/name`.
fn subset(dir: &Path, name: &str, range: std::ops::Range<usize>) -> PathBuf {
    let text = std::fs::read_to_string(data("train.jsonl")).expect("train.jsonl");
    let lines: Vec<&str> = text.lines().collect();
    let p = dir.join(name);
    std::fs::write(&p, lines[range].join("\n") + "\n").expect("write subset");
    p
}

/// Flags every run of the concurrent-runs test shares (the defaults of its config files).
const SHARED: &[&str] = &[
    "--quiet",
    "--seq-len",
    "64",
    "--batch",
    "2",
    "--warmup",
    "1",
    "--save-every",
    "2",
];

fn octoflow_train(model: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_octoflow"));
    c.arg("train").arg("-m").arg(model).args(SHARED);
    c
}

#[test]
fn concurrent_runs_log_what_each_logs_alone_in_their_own_dirs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let model = tiny_model(dir);
    subset(dir, "a.jsonl", 0..200);
    subset(dir, "b.jsonl", 200..400);
    short_eval(dir, 4);
    // run a: 5 steps with evaluations; run b: other data, rank, lr, seed, dropout and
    // accumulation, 2 steps (it finishes first); paths relative to the config files
    std::fs::create_dir_all(dir.join("cfg")).expect("cfg dir");
    let a_toml = dir.join("cfg/a.toml");
    std::fs::write(
        &a_toml,
        "data = \"../a.jsonl\"\neval = \"../eval-short.jsonl\"\nrank = 4\nlr = 1e-2\nseed = 3\n\
         max_steps = 5\neval_every = 2\n",
    )
    .expect("a.toml");
    let b_toml = dir.join("cfg/b.toml");
    std::fs::write(
        &b_toml,
        "data = \"../b.jsonl\"\noutput = \"../runs/b\"\nrank = 8\nalpha = 8\nlr = 5e-3\n\
         seed = 11\nmax_steps = 2\ngrad_accum = 2\ndropout = 0.1\ntargets = [\"q\", \"v\", \"down\"]\n",
    )
    .expect("b.toml");
    let out = octoflow_train(&model)
        .arg("--config")
        .arg(&a_toml)
        .arg("--config")
        .arg(&b_toml)
        .arg("-o")
        .arg(dir.join("runs"))
        .output()
        .expect("train runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    println!("{err}");
    assert!(
        err.contains("weights") && err.contains("(once) + runs") && err.contains("together"),
        "{err}"
    );
    assert!(
        err.contains("[a] step 5/5") && err.contains("[b] step 2/2"),
        "{err}"
    );
    let (run_a, run_b) = (dir.join("runs/a"), dir.join("runs/b"));
    // the same runs alone, with flags instead of config files
    let alone_a = dir.join("alone-a");
    let alone_b = dir.join("alone-b");
    for (args, data, out_dir) in [
        (
            &[
                "--rank",
                "4",
                "--lr",
                "1e-2",
                "--seed",
                "3",
                "--max-steps",
                "5",
            ][..],
            "a.jsonl",
            &alone_a,
        ),
        (
            &[
                "--rank",
                "8",
                "--alpha",
                "8",
                "--lr",
                "5e-3",
                "--seed",
                "11",
                "--max-steps",
                "2",
                "--grad-accum",
                "2",
                "--dropout",
                "0.1",
                "--targets",
                "q,v,down",
            ][..],
            "b.jsonl",
            &alone_b,
        ),
    ] {
        let mut c = octoflow_train(&model);
        c.args(args).arg("--data").arg(dir.join(data));
        if data == "a.jsonl" {
            c.args(["--eval-every", "2", "--eval"])
                .arg(dir.join("eval-short.jsonl"));
        }
        let o = c.arg("-o").arg(out_dir).output().expect("train alone");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    for (together, alone, steps) in [(&run_a, &alone_a, 5u64), (&run_b, &alone_b, 2)] {
        assert!(together.join("checkpoint.gguf").exists(), "{together:?}");
        let (tt, et) = log(together);
        let (ta, ea) = log(alone);
        assert_eq!(
            tt.iter().map(|x| x.0).collect::<Vec<_>>(),
            (1..=steps).collect::<Vec<_>>(),
            "{together:?}"
        );
        assert_eq!(tt.len(), ta.len());
        assert_eq!(et.len(), ea.len());
        for ((s, l), (_, m)) in tt.iter().chain(&et).zip(ta.iter().chain(&ea)) {
            // the same kernels on the same inputs: only a difference in the runs' isolation
            // (a shared buffer, a race between queues) could move a loss
            assert!(
                (l - m).abs() <= 1e-6 * m.abs(),
                "{together:?} step {s}: {l} together vs {m} alone"
            );
        }
    }
    let (_, ea) = log(&run_a);
    assert_eq!(ea.iter().map(|x| x.0).collect::<Vec<_>>(), [0, 2, 4, 5]);
    // runs differ from each other (different adapters, data and seeds)
    assert_ne!(log(&run_a).0[0].1, log(&run_b).0[0].1);

    // --resume continues every run (both are complete: nothing left to train)
    let out = octoflow_train(&model)
        .arg("--config")
        .arg(&a_toml)
        .arg("--config")
        .arg(&b_toml)
        .arg("-o")
        .arg(dir.join("runs"))
        .arg("--resume")
        .output()
        .expect("resume runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("[a] resumed at step 5") && err.contains("[b] resumed at step 2"),
        "{err}"
    );
    assert_eq!(log(&run_a).0.len(), 5);
}

#[test]
fn bad_run_configs_are_clear_errors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let model = tiny_model(dir);
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "rank = 4\nlearning_rate = 1e-3\n").expect("bad.toml");
    let out = octoflow_train(&model)
        .arg("--config")
        .arg(&bad)
        .arg("--data")
        .arg(data("train.jsonl"))
        .arg("-o")
        .arg(dir.join("runs"))
        .output()
        .expect("train runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("bad.toml") && err.contains("unknown key \"learning_rate\""),
        "{err}"
    );
    // two runs writing to one directory
    let (x, y) = (dir.join("x.toml"), dir.join("y.toml"));
    for p in [&x, &y] {
        std::fs::write(p, "output = \"same\"\n").expect("toml");
    }
    let out = octoflow_train(&model)
        .arg("--config")
        .arg(&x)
        .arg("--config")
        .arg(&y)
        .arg("--data")
        .arg(data("train.jsonl"))
        .output()
        .expect("train runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("both write to"),
        "{err}"
    );
    // without --config, --data and --output are required
    let out = octoflow_train(&model).output().expect("train runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--output"), "{err}");
}

// ---- --device cpu ----

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

/// `data/NAME` of the repository.
fn repo_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data")
        .join(name)
}

fn octoflow_out(args: &[&str]) -> Output {
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
    let train = repo_data("facts/train.jsonl");
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
    let questions = std::fs::read_to_string(repo_data("facts/questions.jsonl")).expect("questions");
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
            .arg(repo_data("pirate/train.jsonl"))
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
    // one step's loss depends on its batch (a batch of examples cut before their answers
    // logs 0, one with few answer tokens a noisy value): the last three steps with a loss,
    // on average, against the first
    let late: Vec<f64> = logs[0]
        .iter()
        .rev()
        .map(|l| l.1)
        .filter(|&l| l > 0.0)
        .take(3)
        .collect();
    let late_mean = late.iter().sum::<f64>() / late.len().max(1) as f64;
    assert!(
        late.len() == 3 && late_mean < logs[0][0].1,
        "the loss did not fall: {:?}",
        logs[0]
    );
}

#[test]
fn several_runs_or_profiling_on_the_cpu_are_clear_errors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = tmp.path().join("a.toml");
    std::fs::write(&cfg, "data = \"x.jsonl\"\n").expect("write a.toml");
    let train = repo_data("facts/train.jsonl");
    let o = octoflow_out(&[
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
    let o = octoflow_out(&[
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
