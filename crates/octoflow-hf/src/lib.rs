//! Hugging Face model folders — `config.json`, `model.safetensors` (or shards with
//! `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json` — read as the same
//! GGUF metadata and tensors llama.cpp's `convert_hf_to_gguf.py` would produce, so the rest of
//! OctoFlow loads a folder as it loads a `.gguf`, and `octoflow convert` writes it out.
//!
//! ```no_run
//! let folder = octoflow_hf::HfFolder::open("./my-model")?;
//! let gguf = folder.to_gguf(None)?;
//! println!("{}", gguf.get_str("general.architecture")?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod config;
pub mod error;
pub mod folder;
mod json;
pub mod names;
pub mod peft;
pub mod shards;
pub mod tokenizer;

pub use config::{Family, HfConfig};
pub use error::{HfError, Result};
pub use folder::{is_folder, open_model, HfFolder};
