//! `octoflow serve` as a user runs it: the real `openai` Python client against the binary, and a
//! graceful stop on SIGTERM. The model is the smallest real one on the CPU engine (skipped when
//! it is not in the cache); the client comes from `scripts/deps.sh`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SMOLLM: &str = "smollm2-135m-instruct-q4_1";

fn model_present() -> bool {
    let root = std::env::var_os("OCTOFLOW_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/octoflow")));
    let present = root.is_some_and(|r| r.join("models").join(format!("{SMOLLM}.gguf")).exists());
    if !present {
        eprintln!("skipped: {SMOLLM} is not in the model cache (octoflow pull {SMOLLM})");
    }
    present
}

/// A running `octoflow serve` on a free port, and its address from the banner.
struct Served {
    child: Child,
    addr: String,
    stderr: BufReader<std::process::ChildStderr>,
}

fn serve(device: &str, extra: &[&str]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args([
            "serve", "-m", SMOLLM, "--device", device, "--port", "0", "-c", "256",
        ])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("octoflow serve starts");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    let addr = loop {
        line.clear();
        let n = stderr.read_line(&mut line).expect("stderr line");
        assert!(n > 0, "octoflow serve exited before its banner");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            assert!(
                line.contains("instances") && line.contains("device"),
                "{line}"
            );
            break rest.trim().to_string();
        }
    };
    Served {
        child,
        addr,
        stderr,
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn the_openai_python_client_works_against_the_server() {
    if !model_present() {
        return;
    }
    let has_client = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_client,
        "the openai Python package is missing: run scripts/deps.sh"
    );
    // the product path: the batched GPU engine (lavapipe in CI)
    let s = serve("gpu", &["--instances", "2"]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../octoflow-serve/tests/openai_client.py"
    );
    let out = Command::new("python3")
        .args([script, &format!("http://{}/v1", s.addr), SMOLLM])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "openai client checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

#[test]
fn sigterm_finishes_the_running_request_and_exits_cleanly() {
    if !model_present() {
        return;
    }
    let mut s = serve("cpu", &["--instances", "1"]);
    let body = r#"{"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": true, "ignore_eos": true}"#;
    let mut conn = TcpStream::connect(&s.addr).expect("connects");
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        s.addr,
        body.len()
    )
    .expect("request sent");
    // Wait for the first token, then ask the server to stop.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("data: {") {
        let n = conn.read(&mut buf).expect("response bytes");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let pid = i32::try_from(s.child.id()).expect("pid");
    // SAFETY: sending a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    conn.read_to_end(&mut got).expect("the rest of the stream");
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    let status = s.child.wait().expect("exits");
    assert!(status.success(), "exit status {status}");
    let mut rest = String::new();
    let _ = s.stderr.read_to_string(&mut rest);
    assert!(rest.contains("stopped"), "{rest}");
}
