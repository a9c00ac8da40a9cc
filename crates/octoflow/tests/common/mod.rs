//! What several of these integration tests share: asking llama.cpp itself (llama-cpp-python,
//! installed by scripts/test-deps.sh) through the scripts of scripts/check/.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `scripts/check/SCRIPT MODEL` with `request` as JSON on its standard input and returns
/// the JSON it prints; a script that fails fails the test with its standard error.
pub fn llama_cpp_script(
    script: &str,
    model: &Path,
    request: &serde_json::Value,
) -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/check")
        .join(script);
    let mut child = Command::new("python3")
        .arg(path)
        .arg(model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request.to_string().as_bytes())
        .expect("request written");
    let out = child.wait_with_output().expect("the script ends");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{script} printed no JSON: {e}"))
}
