//! Structured output, tool calls and the API key of `octoflow serve`, end to end: the real
//! `openai` Python client (outputs validated with `jsonschema`) against the binary serving
//! qwen2.5-coder-0.5b-instruct, whose template writes Hermes-style `<tool_call>`s (skipped
//! when the model is not in the cache); the clients come from `scripts/test-deps.sh`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const KEY: &str = "sk-octoflow-test";

fn model_present() -> bool {
    let root = std::env::var_os("OCTOFLOW_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/octoflow")));
    let present = root.is_some_and(|r| r.join("models").join(format!("{QWEN}.gguf")).exists());
    if !present {
        eprintln!("skipped: {QWEN} is not in the model cache (octoflow pull {QWEN})");
    }
    present
}

/// A running `octoflow serve`, killed on drop.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts the server with `extra` flags; returns it, its address and the stderr lines up to
/// the banner.
fn serve(extra: &[&str]) -> (Served, String, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args([
            "serve",
            "-m",
            QWEN,
            "--port",
            "0",
            "-c",
            "768",
            "--instances",
            "2",
        ])
        .args(extra)
        .env_remove("OCTOFLOW_API_KEY")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("octoflow serve starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let served = Served(child);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = stderr.read_line(&mut line).expect("stderr line");
        assert!(n > 0, "octoflow serve exited before its banner: {lines:?}");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            let addr = rest.trim().to_string();
            // The warning, if any, follows the banner.
            let mut next = String::new();
            if extra.contains(&"0.0.0.0") {
                let _ = stderr.read_line(&mut next);
            }
            lines.push(line);
            lines.push(next);
            return (served, addr, lines);
        }
        lines.push(line);
    }
}

#[test]
fn structured_output_tools_and_the_api_key_work_with_the_openai_client() {
    if !model_present() {
        return;
    }
    for module in ["openai", "jsonschema"] {
        let ok = Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "the {module} Python package is missing: run scripts/test-deps.sh"
        );
    }
    let (_s, addr, _) = serve(&["--device", "gpu", "--api-key", KEY]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../octoflow-serve/tests/structured_client.py"
    );
    let out = Command::new("python3")
        .args([script, &format!("http://{addr}/v1"), QWEN, KEY])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "structured-output checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

#[test]
fn a_public_address_without_a_key_warns() {
    if !model_present() {
        return;
    }
    let (_s, _, lines) = serve(&["--device", "cpu", "--host", "0.0.0.0"]);
    assert!(
        lines.iter().any(|l| l.contains("without an API key")),
        "{lines:?}"
    );
}
