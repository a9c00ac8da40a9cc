//! Training support that needs no GPU: reading and tokenizing JSONL training data with per-token
//! training masks ([`data`]), packing examples into fixed-length rows, learning-rate schedules
//! ([`schedule`]), atomic checkpoints of adapters and optimizer state ([`checkpoint`]) and the
//! JSONL loss log of a run ([`log`]).
//!
//! A run directory (`RUN_DIR`) holds `checkpoint.gguf` and `log.jsonl`.

pub mod checkpoint;
pub mod data;
pub mod error;
pub mod log;
pub mod schedule;

pub use checkpoint::{Checkpoint, NamedTensor};
pub use data::{epoch_order, load_jsonl, pack, Example, PackStats, Sequence, IGNORE};
pub use error::{Result, TrainError};
pub use log::{read_log, LossLog};
pub use schedule::{lr_at, Schedule};
