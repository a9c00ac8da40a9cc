//! GGUF files: our own reader and writer (zero-copy, validating every count and offset) and the
//! GGML quant block formats on the CPU.
//!
//! ```no_run
//! let file = octoflow_gguf::GgufFile::open("model.gguf")?;
//! let arch = file.get_str("general.architecture")?;
//! let embd = file.require_tensor("token_embd.weight")?;
//! println!("{arch}: {} {:?} {}", embd.name, embd.dims, embd.ty);
//! # Ok::<(), octoflow_gguf::GgufError>(())
//! ```

pub mod error;
pub mod quant;
pub mod reader;
pub mod types;
pub mod value;
pub mod writer;

pub use error::{GgufError, Result};
pub use reader::{parse_header, GgufFile, Header, TensorInfo};
pub use types::GgmlType;
pub use value::{Value, ValueType};
pub use writer::{GgufWriter, WriterTensor};
