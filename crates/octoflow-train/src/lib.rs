//! QLoRA fine-tuning: a frozen quantized base model on the GPU with trainable LoRA adapters.
//!
//! - [`data`]: JSONL records tokenized with per-token training masks, packed into fixed-length
//!   rows; [`schedule`]: learning-rate schedules; [`checkpoint`]: atomic checkpoints of adapters
//!   and optimizer state; [`log`]: the JSONL loss log of a run.
//! - [`lora`]: which projections carry adapters and where they live in the flat parameter buffer.
//! - [`gpu`]: the training step as dispatch chains (forward, loss, backward, AdamW);
//!   [`cpu`]: the same step on the CPU's cores; [`backend`]: what the loop needs of either.
//! - [`run`]: the training loop (epochs, accumulation, evaluation, checkpoints, resume).
//! - [`reference`]: the f64 CPU reference of the loss the gradient tests differentiate.
//! - [`merge`]: adapters folded into the base weights (`octoflow run --lora`); [`export`]: a
//!   llama.cpp LoRA adapter GGUF and a merged (optionally requantized) model GGUF.
//!
//! A run directory (`RUN_DIR`) holds `checkpoint.gguf` and `log.jsonl`.

pub mod backend;
pub mod checkpoint;
pub mod cpu;
pub mod data;
pub mod error;
pub mod export;
pub mod gpu;
pub mod log;
pub mod lora;
pub mod merge;
pub mod reference;
pub mod run;
pub mod schedule;

pub use backend::Backend;
pub use checkpoint::{Checkpoint, NamedTensor};
pub use cpu::CpuTrainer;
pub use data::{epoch_order, load_jsonl, pack, Example, PackStats, Sequence, IGNORE};
pub use error::{Result, TrainError};
pub use gpu::{Rows, Trainer, TrainerOptions, TransposedWeights};
pub use log::{read_log, LossLog};
pub use lora::{LoraConfig, LoraEntry, LoraLayout, Target};
pub use schedule::{lr_at, Schedule};
