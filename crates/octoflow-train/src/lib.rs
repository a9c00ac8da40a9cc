//! QLoRA fine-tuning: a frozen quantized base model on the GPU with trainable LoRA adapters.

pub mod error;
pub mod gpu;
pub mod lora;
pub mod reference;

pub use error::{Result, TrainError};
pub use gpu::{Rows, Trainer, TrainerOptions};
pub use lora::{LoraConfig, LoraEntry, LoraLayout, Target};
pub mod merge;
pub mod run;
