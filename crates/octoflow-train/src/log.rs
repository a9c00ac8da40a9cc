//! The loss log: `RUN_DIR/log.jsonl`, one JSON object per line. The trainer writes
//! `{"step","loss","lr","grad_norm","tokens","tok_per_s","elapsed_s"}` after optimizer steps and
//! `{"step","eval_loss"}` after evaluations.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Result, TrainError};

/// The log file's name inside a run directory.
pub const FILE_NAME: &str = "log.jsonl";

/// An open loss log, appended to line by line.
#[derive(Debug)]
pub struct LossLog {
    path: PathBuf,
    file: File,
}

impl LossLog {
    /// Opens `RUN_DIR/log.jsonl` (creating `RUN_DIR` if missing). `resume_step: Some(s)` keeps
    /// only the lines whose `"step"` is `<= s` (lines after the checkpoint being resumed, and a
    /// line torn by a crash, are dropped; the file is rewritten atomically); `None` starts a
    /// fresh, empty file.
    pub fn open(run_dir: &Path, resume_step: Option<u64>) -> Result<Self> {
        std::fs::create_dir_all(run_dir).map_err(|e| TrainError::io(run_dir, e))?;
        let path = run_dir.join(FILE_NAME);
        let io = |e| TrainError::io(&path, e);
        let file = match resume_step {
            None => File::create(&path).map_err(io)?,
            Some(s) => {
                let kept = match std::fs::read_to_string(&path) {
                    Ok(text) => text
                        .lines()
                        .filter(|line| {
                            serde_json::from_str::<Value>(line)
                                .ok()
                                .and_then(|v| v.get("step").and_then(Value::as_u64))
                                .is_some_and(|step| step <= s)
                        })
                        .fold(String::new(), |mut acc, line| {
                            acc.push_str(line);
                            acc.push('\n');
                            acc
                        }),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                    Err(e) => return Err(io(e)),
                };
                let tmp = run_dir.join(format!("{FILE_NAME}.tmp"));
                let tmp_io = |e| TrainError::io(&tmp, e);
                let mut f = File::create(&tmp).map_err(tmp_io)?;
                f.write_all(kept.as_bytes()).map_err(tmp_io)?;
                f.sync_all().map_err(tmp_io)?;
                drop(f);
                std::fs::rename(&tmp, &path).map_err(io)?;
                OpenOptions::new().append(true).open(&path).map_err(io)?
            }
        };
        Ok(Self { path, file })
    }

    /// Appends `v` as one line and flushes it to the file.
    pub fn append(&mut self, v: &Value) -> Result<()> {
        let mut line = v.to_string();
        line.push('\n');
        let io = |e| TrainError::io(&self.path, e);
        self.file.write_all(line.as_bytes()).map_err(io)?;
        self.file.flush().map_err(io)
    }

    /// The log file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads every record of `RUN_DIR/log.jsonl` (empty when there is none). Blank lines are
/// skipped; a final line without its newline that does not parse (torn by a crash) is dropped;
/// any other line that is not a JSON object is a [`TrainError::Log`] naming the line.
pub fn read_log(run_dir: &Path) -> Result<Vec<Value>> {
    let path = run_dir.join(FILE_NAME);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrainError::io(&path, e)),
    };
    let n_lines = text.lines().count();
    let torn_tail = !text.is_empty() && !text.ends_with('\n');
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(v) if v.is_object() => out.push(v),
            _ if torn_tail && i + 1 == n_lines => {}
            Ok(_) => {
                return Err(TrainError::Log {
                    path,
                    line: i + 1,
                    message: "not a JSON object".to_string(),
                })
            }
            Err(e) => {
                return Err(TrainError::Log {
                    path,
                    line: i + 1,
                    message: e.to_string(),
                })
            }
        }
    }
    Ok(out)
}
