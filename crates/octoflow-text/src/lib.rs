//! Text in and out of models: tokenizers built from GGUF metadata, chat templates, stop strings.
//!
//! ```no_run
//! use octoflow_text::{ChatTemplate, Message, Tokenizer};
//! let file = octoflow_gguf::GgufFile::open("model.gguf")?;
//! let tokenizer = Tokenizer::from_gguf(&file)?;
//! let prompt = ChatTemplate::from_gguf(&file)?.render(&[Message::user("Hi!")], true)?;
//! let ids = tokenizer.encode(&prompt, true, true); // add BOS if the model wants it, parse <|specials|>
//! println!("{ids:?} = {:?}", tokenizer.decode_with_special(&ids));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Tokenization agrees with llama.cpp's (`llama_tokenize`) id for id; the tests check every
//! case of the golden files under `tests/golden/`. A model read from a Hugging Face folder
//! encodes through its own `tokenizer.json` instead ([`Tokenizer::with_tokenizer_json`], the
//! `tokenizers` crate), as transformers does.

mod bpe;
pub mod chat;
pub mod error;
pub mod harmony;
mod hash;
mod partition;
mod pretokenize;
mod pyfunc;
pub mod special;
mod spm;
pub mod stream;
pub mod tokenizer;
mod tokenizer_json;
mod unicode;
pub mod vocab;

pub use chat::{BuiltinFormat, ChatTemplate, Message};
pub use error::TextError;
pub use special::SpecialTokens;
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
pub use vocab::{TokenAttr, Vocab};

pub mod stop;
