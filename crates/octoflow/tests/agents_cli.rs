//! `octoflow agents` as a user runs it, on smollm2 (lavapipe in CI): the queue pattern, run on
//! the GPU K steps a submit, answers each task exactly as `octoflow run` does, the debate runs
//! to its last round, and bad programs and task files are clear errors.

use std::path::Path;
use std::process::{Command, Output};

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

fn octoflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args(args)
        .output()
        .expect("the octoflow binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .expect("the output file exists")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each output line is JSON"))
        .collect()
}

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def add(a, b):",
    "Three colors of the rainbow are",
];

#[test]
fn the_queue_pattern_answers_each_task_as_run_does() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    let body: String = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "{}\n",
                serde_json::json!({"id": format!("t{i}"), "prompt": p})
            )
        })
        .collect();
    std::fs::write(&tasks, body).unwrap();
    let out = dir.path().join("out.jsonl");
    let o = octoflow(&[
        "agents",
        "-m",
        SMOLLM,
        "--pattern",
        "queue",
        "--tasks",
        tasks.to_str().unwrap(),
        "--instances",
        "2",
        "-n",
        "10",
        "--temp",
        "0",
        "-c",
        "256",
        "--max-rows",
        "16",
        "--steps",
        "4",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("on the GPU, 4 steps a submit"), "{e}");
    assert!(e.contains("submits per generated token"), "{e}");
    let got = lines(&out);
    assert_eq!(got.len(), PROMPTS.len(), "{got:?}");
    for (i, prompt) in PROMPTS.iter().enumerate() {
        let line = got
            .iter()
            .find(|l| l["id"] == format!("t{i}"))
            .unwrap_or_else(|| panic!("no output for task t{i}: {got:?}"));
        assert_eq!(line["round"], 0);
        assert!(line["instance"].as_u64().is_some_and(|n| n < 2), "{line}");
        let run = octoflow(&[
            "run", "-m", SMOLLM, "-p", prompt, "-n", "10", "--temp", "0", "-c", "256",
        ]);
        assert!(run.status.success(), "{}", stderr(&run));
        let want = String::from_utf8_lossy(&run.stdout);
        let want = want.strip_suffix('\n').unwrap_or(&want);
        assert_eq!(line["text"], want, "task {i} ({prompt:?})");
        let finish = line["finish"].as_str().unwrap();
        assert!((finish == "length") == (line["tokens"] == 10), "{line}");
    }
}

#[test]
fn a_debate_runs_every_round_and_writes_each_answer() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(
        &tasks,
        "{\"id\": 7, \"messages\": [{\"role\": \"user\", \"content\": \"Is 17 prime? Answer in one word.\"}]}\n",
    )
    .unwrap();
    let out = dir.path().join("out.jsonl");
    let o = octoflow(&[
        "agents",
        "-m",
        SMOLLM,
        "--pattern",
        "debate",
        "--tasks",
        tasks.to_str().unwrap(),
        "--instances",
        "2",
        "--rounds",
        "2",
        "-n",
        "6",
        "--temp",
        "0.7",
        "--seed",
        "3",
        "-c",
        "512",
        "--max-rows",
        "16",
        "--steps",
        "3",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = lines(&out);
    assert_eq!(got.len(), 4, "2 instances × 2 rounds: {got:?}");
    for inst in 0..2u64 {
        for round in 0..2u64 {
            assert!(
                got.iter()
                    .any(|l| l["id"] == 7 && l["instance"] == inst && l["round"] == round),
                "instance {inst} round {round}: {got:?}"
            );
        }
    }
}

#[test]
fn bad_programs_and_task_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("tasks.jsonl");
    std::fs::write(&good, "{\"prompt\": \"Hi\"}\n").unwrap();
    let out = dir.path().join("out.jsonl");
    let out = out.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["agents", "-m", SMOLLM, "-o", out, "--device", "cpu"];
        args.extend_from_slice(extra);
        octoflow(&args)
    };
    let expect = |o: Output, what: &str| {
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(e.contains(what), "expected {what:?} in: {e}");
        assert!(!e.contains("panicked"), "{e}");
    };
    let g = good.to_str().unwrap();
    expect(run(&["--pattern", "chorus", "--tasks", g]), "chorus");
    let prog = dir.path().join("bad.s");
    std::fs::write(&prog, "    set r0, 1\n    frobnicate r0\n    halt\n").unwrap();
    expect(
        run(&["--program", prog.to_str().unwrap(), "--tasks", g]),
        "line 2",
    );
    for (body, what) in [
        ("{\"prompt\": \"a\"}\nnot json\n", ":2: not JSON"),
        ("{\"prompt\": 3}\n", "\"prompt\" must be a string"),
        ("{\"id\": 1}\n", "needs \"prompt\" or \"messages\""),
        ("\n\n", "no tasks"),
    ] {
        let bad = dir.path().join("bad.jsonl");
        std::fs::write(&bad, body).unwrap();
        expect(
            run(&["--pattern", "queue", "--tasks", bad.to_str().unwrap()]),
            what,
        );
    }
    expect(
        run(&["--pattern", "queue", "--tasks", g, "--instances", "0"]),
        "--instances",
    );
}
