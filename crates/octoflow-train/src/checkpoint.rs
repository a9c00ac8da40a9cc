//! Checkpoints: `RUN_DIR/checkpoint.gguf`, a GGUF file of F32 tensors (adapters and optimizer
//! moments) plus `octoflow.train.*` metadata (progress counters, the run's options, free-form
//! u64 state), replaced atomically on every save.
//!
//! Metadata keys: `octoflow.train.format` (u32, 1), `.step`, `.epoch`, `.batch_in_epoch`,
//! `.tokens` (u64), `.config_json` (string), `.extra.<name>` (u64, in order) and `.checksum`
//! (u64, FNV-1a of all tensor data bytes in file order, so silent corruption is detected).

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};

use octoflow_gguf::{GgmlType, GgufFile, GgufWriter, Value};

use crate::error::{Result, TrainError};

/// The checkpoint file's name inside a run directory.
pub const FILE_NAME: &str = "checkpoint.gguf";
const TMP_NAME: &str = "checkpoint.gguf.tmp";
const PREFIX: &str = "octoflow.train.";
const EXTRA_PREFIX: &str = "octoflow.train.extra.";
const FORMAT: u32 = 1;

/// A named f32 tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    /// Unique name within the checkpoint.
    pub name: String,
    /// Shape, outermost dimension first (`[rows, cols]` for a row-major matrix); 1 to 4
    /// dimensions. Stored in the GGUF in ggml order (reversed).
    pub shape: Vec<u64>,
    /// Row-major values; `product(shape)` of them.
    pub data: Vec<f32>,
}

/// The state of a training run.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Completed optimizer steps.
    pub step: u64,
    /// Epoch of the next batch.
    pub epoch: u64,
    /// Index of the next batch within `epoch`.
    pub batch_in_epoch: u64,
    /// Tokens trained so far.
    pub tokens: u64,
    /// The run's options as JSON (resume checks them).
    pub config_json: String,
    /// Free-form u64 state (e.g. RNG seeds), names unique.
    pub extra: Vec<(String, u64)>,
    /// Adapters and optimizer moments (any names/shapes), f32.
    pub tensors: Vec<NamedTensor>,
}

/// The checkpoint path of a run directory.
pub fn path(run_dir: &Path) -> PathBuf {
    run_dir.join(FILE_NAME)
}

/// Writes `RUN_DIR/checkpoint.gguf` atomically: the GGUF is written to a temp file in `RUN_DIR`
/// (created if missing), fsynced, renamed over the old one, and the directory fsynced. A crash
/// at any point leaves the old or the new checkpoint, never a torn one.
pub fn save(run_dir: &Path, ck: &Checkpoint) -> Result<()> {
    let final_path = path(run_dir);
    let bad = |message: String| TrainError::Checkpoint {
        path: final_path.clone(),
        message,
    };
    std::fs::create_dir_all(run_dir).map_err(|e| TrainError::io(run_dir, e))?;
    let mut w = GgufWriter::new();
    w.set(key("format"), Value::U32(FORMAT));
    w.set(key("step"), Value::U64(ck.step));
    w.set(key("epoch"), Value::U64(ck.epoch));
    w.set(key("batch_in_epoch"), Value::U64(ck.batch_in_epoch));
    w.set(key("tokens"), Value::U64(ck.tokens));
    w.set(key("config_json"), Value::String(ck.config_json.clone()));
    for (name, v) in &ck.extra {
        let k = format!("{EXTRA_PREFIX}{name}");
        if w.metadata().iter().any(|(have, _)| *have == k) {
            return Err(bad(format!("extra value {name:?} given twice")));
        }
        w.set(k, Value::U64(*v));
    }
    let mut hash = Fnv::new();
    for t in &ck.tensors {
        let n = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        if t.shape.is_empty() || t.shape.len() > 4 || n != Some(t.data.len() as u64) {
            return Err(bad(format!(
                "tensor {:?}: shape {:?} does not fit its {} values (1 to 4 dimensions)",
                t.name,
                t.shape,
                t.data.len()
            )));
        }
        let bytes: Vec<u8> = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
        hash.update(&bytes);
        let dims: Vec<u64> = t.shape.iter().rev().copied().collect();
        w.add_tensor(t.name.clone(), GgmlType::F32, &dims, Cow::Owned(bytes))
            .map_err(|e| bad(e.to_string()))?;
    }
    w.set(key("checksum"), Value::U64(hash.finish()));

    let tmp = run_dir.join(TMP_NAME);
    let result = (|| {
        let io = |e| TrainError::io(&tmp, e);
        let file = std::fs::File::create(&tmp).map_err(io)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        w.write_to(&mut out).map_err(|e| bad(e.to_string()))?;
        out.flush().map_err(io)?;
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(&tmp, &final_path).map_err(|e| TrainError::io(&final_path, e))?;
        sync_dir(run_dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Makes a rename inside `dir` durable (a no-op where directories cannot be opened).
fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let d = std::fs::File::open(dir).map_err(|e| TrainError::io(dir, e))?;
        d.sync_all().map_err(|e| TrainError::io(dir, e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Reads `RUN_DIR/checkpoint.gguf`: `None` when there is none; a corrupt or truncated file is a
/// [`TrainError::Checkpoint`] naming it.
pub fn load(run_dir: &Path) -> Result<Option<Checkpoint>> {
    let file_path = path(run_dir);
    let bytes = match std::fs::read(&file_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TrainError::io(&file_path, e)),
    };
    let bad = |message: String| TrainError::Checkpoint {
        path: file_path.clone(),
        message,
    };
    let file = GgufFile::from_bytes(bytes).map_err(|e| bad(format!("not a valid GGUF: {e}")))?;
    let u64_of = |name: &str| -> Result<u64> {
        match file.get(&key(name)) {
            Some(Value::U64(v)) => Ok(*v),
            Some(other) => Err(bad(format!(
                "{} is {}, expected u64",
                key(name),
                other.type_description()
            ))),
            None => Err(bad(format!("missing {}", key(name)))),
        }
    };
    match file.get(&key("format")) {
        Some(Value::U32(FORMAT)) => {}
        Some(v) => return Err(bad(format!("unsupported {} {v}", key("format")))),
        None => return Err(bad(format!("missing {}", key("format")))),
    }
    let config_json = match file.get(&key("config_json")) {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(bad(format!("missing string {}", key("config_json")))),
    };
    let mut extra = Vec::new();
    for (k, v) in file.metadata() {
        if let Some(name) = k.strip_prefix(EXTRA_PREFIX) {
            match v {
                Value::U64(x) => extra.push((name.to_string(), *x)),
                other => {
                    return Err(bad(format!(
                        "{k} is {}, expected u64",
                        other.type_description()
                    )))
                }
            }
        }
    }
    let mut hash = Fnv::new();
    let mut tensors = Vec::with_capacity(file.tensors().len());
    for info in file.tensors() {
        if info.ty != GgmlType::F32 {
            return Err(bad(format!(
                "tensor {:?} is {}, expected F32",
                info.name, info.ty
            )));
        }
        let bytes = file.tensor_data(info);
        hash.update(bytes);
        let data = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        tensors.push(NamedTensor {
            name: info.name.clone(),
            shape: info.dims.iter().rev().copied().collect(),
            data,
        });
    }
    if u64_of("checksum")? != hash.finish() {
        return Err(bad(
            "tensor data checksum mismatch (the file is corrupt)".to_string()
        ));
    }
    Ok(Some(Checkpoint {
        step: u64_of("step")?,
        epoch: u64_of("epoch")?,
        batch_in_epoch: u64_of("batch_in_epoch")?,
        tokens: u64_of("tokens")?,
        config_json,
        extra,
        tensors,
    }))
}

fn key(name: &str) -> String {
    format!("{PREFIX}{name}")
}

/// 64-bit FNV-1a over bytes.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
