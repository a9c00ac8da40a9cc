//! Encoding through Hugging Face's `tokenizers` crate, for a model read from a folder: the
//! folder's `tokenizer.json` is that library's own format, so its normalizers, pre-tokenizers,
//! added tokens and post-processor give exactly the ids transformers gives, including where
//! llama.cpp's reading of the converted metadata differs (Metaspace's "first" prepend scheme).
//! Decoding stays with the vocabulary's pieces, which both share.

use std::path::{Path, PathBuf};

use crate::error::TextError;
use crate::vocab::Vocab;

/// `tokenizer.json` loaded twice: once splitting special tokens out of the text (`<|im_start|>`
/// becomes its id) and once reading them as plain text, `tokenizers`' per-instance switch.
#[derive(Debug)]
pub(crate) struct JsonEncoder {
    path: PathBuf,
    parse_special: tokenizers::Tokenizer,
    literal_special: tokenizers::Tokenizer,
}

impl JsonEncoder {
    /// Loads `path` and checks that each of its tokens has the id `vocab` gives it, so the ids
    /// it produces mean what the model's embedding rows and our decoding take them to mean.
    pub(crate) fn open(path: &Path, vocab: &Vocab) -> Result<Self, TextError> {
        let error = |message: String| TextError::TokenizerJson {
            path: path.to_path_buf(),
            message,
        };
        let parse_special =
            tokenizers::Tokenizer::from_file(path).map_err(|e| error(e.to_string()))?;
        let mut entries: Vec<(String, u32)> = parse_special.get_vocab(true).into_iter().collect();
        entries.sort_by_key(|&(_, id)| id);
        for (text, id) in entries {
            match vocab.text(id) {
                Some(ours) if ours == text => {}
                Some(ours) => {
                    return Err(error(format!(
                        "token {id} is {text:?}, but the model's vocabulary has {ours:?} there"
                    )))
                }
                None => {
                    return Err(error(format!(
                        "token {id} ({text:?}) is past the model's vocabulary of {}",
                        vocab.len()
                    )))
                }
            }
        }
        let mut literal_special = parse_special.clone();
        literal_special.set_encode_special_tokens(true);
        Ok(Self {
            path: path.to_path_buf(),
            parse_special,
            literal_special,
        })
    }

    /// The ids of `text`; `add_special` runs the post-processor (BOS where the model has one).
    /// An error is `tokenizers`' own (a pattern that exhausted the regex engine's limits).
    pub(crate) fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TextError> {
        let t = if parse_special {
            &self.parse_special
        } else {
            &self.literal_special
        };
        t.encode_fast(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TextError::TokenizerJson {
                path: self.path.clone(),
                message: format!("encoding {} bytes of text: {e}", text.len()),
            })
    }

    /// The file this encoder was read from.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}
