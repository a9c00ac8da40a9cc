//! Special-token ids (BOS, EOS, end-of-turn, ...), the add-BOS/EOS flags, and the set of tokens
//! that end generation. Read from `tokenizer.ggml.*` metadata with llama.cpp's defaults; where
//! the metadata is silent, end-of-turn and fill-in-the-middle tokens are recognised by their text
//! as llama.cpp does (and marked as control tokens, which decides how text containing them is
//! tokenized).

use octoflow_gguf::GgufFile;

use crate::error::TextError;
use crate::vocab::{TokenAttr, Vocab};

/// Special token ids and flags of a vocabulary.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// End of turn (`<|im_end|>`, `<end_of_turn>`, ...).
    pub eot: Option<u32>,
    /// End of message (`<|eom_id|>`).
    pub eom: Option<u32>,
    /// Unknown.
    pub unk: Option<u32>,
    /// Separator.
    pub sep: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
    /// Whether `encode(.., add_special = true)` prepends BOS.
    pub add_bos: bool,
    /// Whether `encode(.., add_special = true)` appends EOS.
    pub add_eos: bool,
    /// Whether a space is put before text that starts a sequence or follows a special token
    /// (SentencePiece vocabularies only).
    pub add_space_prefix: bool,
    /// Tokens that end generation, sorted.
    pub eog: Vec<u32>,
}

/// Defaults of a tokenizer family, used where the metadata has no value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Defaults {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: bool,
    pub add_space_prefix: bool,
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Tokens that end generation whatever the metadata says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
    // gpt-oss (o200k_harmony): the reply is done, or waits for a tool's result.
    "<|return|>",
    "<|call|>",
    // the rest of llama.cpp's list (llama-vocab.cpp, as of llama-cpp-python 0.3.36): `</s>`
    // too, which gemma 3 carries as a user-defined token
    "<|flush|>",
    "<|calls|>",
    "</s>",
    "[EOT]",
    "[EOS]",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// gpt-oss's harmony markers that llama.cpp always renders (user-defined), so the text of a
/// reply shows its message structure: `<|channel|>analysis<|message|>…`.
const HARMONY_RENDERED: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";

impl SpecialTokens {
    /// Reads ids and flags; may add the control attribute to recognised tokens in `vocab`.
    pub(crate) fn load(
        file: &GgufFile,
        vocab: &mut Vocab,
        defaults: Defaults,
    ) -> Result<Self, TextError> {
        let n = vocab.len();
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let id = |key: &str, default: Option<u32>| -> Result<Option<u32>, TextError> {
            Ok(optional_id(file, key, n)?.or(in_range(default)))
        };
        let mut s = SpecialTokens {
            bos: id(KEY_BOS, defaults.bos)?,
            eos: id("tokenizer.ggml.eos_token_id", defaults.eos)?,
            eot: id("tokenizer.ggml.eot_token_id", None)?,
            eom: id("tokenizer.ggml.eom_token_id", None)?,
            unk: id("tokenizer.ggml.unknown_token_id", defaults.unk)?,
            // llama.cpp's key has this spelling.
            sep: id("tokenizer.ggml.seperator_token_id", None)?,
            pad: id("tokenizer.ggml.padding_token_id", None)?,
            add_bos: optional_bool(file, KEY_ADD_BOS)?.unwrap_or(defaults.add_bos),
            add_eos: optional_bool(file, "tokenizer.ggml.add_eos_token")?.unwrap_or(false),
            add_space_prefix: optional_bool(file, "tokenizer.ggml.add_space_prefix")?
                .unwrap_or(defaults.add_space_prefix),
            eog: Vec::new(),
        };
        if s.add_bos && s.bos.is_none() {
            return Err(TextError::metadata(
                KEY_ADD_BOS,
                format!("is true, but {KEY_BOS} is not set"),
            ));
        }
        if s.add_eos && s.eos.is_none() {
            return Err(TextError::metadata(
                "tokenizer.ggml.add_eos_token",
                "is true, but tokenizer.ggml.eos_token_id is not set",
            ));
        }
        let fim_ids = [
            ("tokenizer.ggml.fim_pre_token_id", FIM_PRE_TEXTS),
            ("tokenizer.ggml.fim_suf_token_id", FIM_SUF_TEXTS),
            ("tokenizer.ggml.fim_mid_token_id", FIM_MID_TEXTS),
            ("tokenizer.ggml.fim_pad_token_id", FIM_PAD_TEXTS),
            ("tokenizer.ggml.fim_rep_token_id", FIM_REP_TEXTS),
            ("tokenizer.ggml.fim_sep_token_id", FIM_SEP_TEXTS),
        ];
        let mut fim = Vec::new();
        for (key, texts) in fim_ids {
            fim.push(match optional_id(file, key, n)? {
                Some(id) => Some(id),
                None => find_and_mark(vocab, texts),
            });
        }
        if s.eot.is_none() {
            s.eot = find_and_mark(vocab, EOT_TEXTS);
        }
        if s.eom.is_none() {
            s.eom = find_and_mark(vocab, EOM_TEXTS);
        }
        s.eog = end_of_generation(vocab, &s, &fim[3..]);
        harmony(vocab, &mut s.eog);
        Ok(s)
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }
}

/// The first token (lowest id) whose text is one of `texts`, marked as a control token.
fn find_and_mark(vocab: &mut Vocab, texts: &[&str]) -> Option<u32> {
    let id = texts.iter().filter_map(|t| vocab.id(t)).min()?;
    vocab.add_attr(id, TokenAttr::CONTROL);
    Some(id)
}

/// EOS, EOT, EOM, the FIM pad/repo/separator tokens, and every token named in [`EOG_TEXTS`]
/// (marked as control tokens).
fn end_of_generation(vocab: &mut Vocab, s: &SpecialTokens, fim: &[Option<u32>]) -> Vec<u32> {
    let mut eog: Vec<u32> = [s.eos, s.eot, s.eom]
        .into_iter()
        .chain(fim.iter().copied())
        .flatten()
        .collect();
    for text in EOG_TEXTS {
        if let Some(id) = vocab.id(text) {
            vocab.add_attr(id, TokenAttr::CONTROL);
            eog.push(id);
        }
    }
    eog.sort_unstable();
    eog.dedup();
    eog
}

/// gpt-oss's vocabulary, as llama.cpp reads it: the harmony markers render as text, and where
/// `<|return|>` and `<|call|>` end generation `<|end|>` does not (it ends one message of a reply
/// that goes on, `…<|end|><|start|>assistant<|channel|>final…`) and renders too.
fn harmony(vocab: &mut Vocab, eog: &mut Vec<u32>) {
    for text in HARMONY_RENDERED {
        if let Some(id) = vocab.id(text) {
            vocab.set_attr(id, TokenAttr::USER_DEFINED);
        }
    }
    let in_eog = |text: &str| vocab.id(text).filter(|id| eog.contains(id));
    if let (Some(_), Some(_), Some(end)) =
        (in_eog("<|return|>"), in_eog("<|call|>"), in_eog("<|end|>"))
    {
        eog.retain(|&id| id != end);
        vocab.set_attr(end, TokenAttr::USER_DEFINED);
    }
}

/// An optional token id; present but out of range or not an integer is an error.
fn optional_id(file: &GgufFile, key: &str, n_vocab: usize) -> Result<Option<u32>, TextError> {
    let Some(v) = file.get(key) else {
        return Ok(None);
    };
    let id = v.as_int().ok_or_else(|| {
        TextError::metadata(
            key,
            format!("is {}, expected a token id", v.type_description()),
        )
    })?;
    if id < 0 || id >= n_vocab as i128 {
        return Err(TextError::metadata(
            key,
            format!("is {id}, outside the vocabulary of {n_vocab} tokens"),
        ));
    }
    Ok(Some(id as u32))
}

fn optional_bool(file: &GgufFile, key: &str) -> Result<Option<bool>, TextError> {
    let Some(v) = file.get(key) else {
        return Ok(None);
    };
    v.as_bool().map(Some).ok_or_else(|| {
        TextError::metadata(key, format!("is {}, expected a bool", v.type_description()))
    })
}
