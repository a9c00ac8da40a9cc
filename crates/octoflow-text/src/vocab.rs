//! The vocabulary as GGUF stores it: `tokenizer.ggml.tokens` (text of each id),
//! `tokenizer.ggml.scores` (SentencePiece merge priority), `tokenizer.ggml.token_type`, and the
//! special-token ids and flags. Defaults and the name-based detection of end-of-generation
//! tokens follow llama.cpp's vocabulary loader, so that our ids agree with its ids.

use crate::hash::FxHashMap;

use octoflow_gguf::{GgufFile, Value};

use crate::error::TextError;

/// Per-token attributes: a bit set, because a token can be, say, user-defined and forced to
/// control at once (llama.cpp does that for end-of-turn and fill-in-the-middle tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenAttr(u8);

impl TokenAttr {
    /// An ordinary piece of text.
    pub const NORMAL: Self = Self(1);
    /// The unknown token (`<unk>`).
    pub const UNKNOWN: Self = Self(2);
    /// A control token (`<bos>`, `<|im_start|>`): rendered as nothing unless asked for.
    pub const CONTROL: Self = Self(4);
    /// A user-defined token: always matched whole in text, rendered verbatim.
    pub const USER_DEFINED: Self = Self(8);
    /// A reserved, unused token.
    pub const UNUSED: Self = Self(16);
    /// A byte-fallback token `<0xNN>`.
    pub const BYTE: Self = Self(32);

    /// Maps `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte) to attributes; any other value has none.
    pub fn from_token_type(ty: i128) -> Self {
        match ty {
            1 => Self::NORMAL,
            2 => Self::UNKNOWN,
            3 => Self::CONTROL,
            4 => Self::USER_DEFINED,
            5 => Self::UNUSED,
            6 => Self::BYTE,
            _ => Self(0),
        }
    }

    /// Whether any bit of `other` is set.
    pub fn intersects(self, other: Self) -> bool {
        self.0 & other.0 != 0
    }

    pub(crate) fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        self.with(rhs)
    }
}

/// Texts, scores and attributes of every token, and the reverse map from text to id.
#[derive(Debug, Clone)]
pub struct Vocab {
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<TokenAttr>,
    ids: FxHashMap<String, u32>,
}

impl Vocab {
    /// Builds a vocabulary from parallel lists (`scores` and `attrs` as long as `texts`).
    /// An empty text becomes `[EMPTY_<id>]`, as llama.cpp does; duplicate texts are an error.
    pub fn new(
        mut texts: Vec<String>,
        scores: Vec<f32>,
        attrs: Vec<TokenAttr>,
    ) -> Result<Self, TextError> {
        debug_assert!(scores.len() == texts.len() && attrs.len() == texts.len());
        let mut ids = FxHashMap::with_capacity_and_hasher(texts.len(), Default::default());
        for (i, text) in texts.iter_mut().enumerate() {
            if text.is_empty() {
                *text = format!("[EMPTY_{i}]");
            }
            if let Some(first) = ids.insert(text.clone(), i as u32) {
                return Err(TextError::DuplicateToken {
                    text: text.clone(),
                    first,
                    second: i as u32,
                });
            }
        }
        Ok(Self {
            texts,
            scores,
            attrs,
            ids,
        })
    }

    /// Reads `tokenizer.ggml.tokens`, `.scores` (optional, f32 or i32) and `.token_type`
    /// (optional; without it every token is normal).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TextError> {
        const TOKENS: &str = "tokenizer.ggml.tokens";
        const SCORES: &str = "tokenizer.ggml.scores";
        const TYPES: &str = "tokenizer.ggml.token_type";
        let tokens = file.get_array(TOKENS)?;
        let mut texts = Vec::with_capacity(tokens.len());
        for (i, v) in tokens.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| {
                TextError::metadata(
                    TOKENS,
                    format!("element {i} is {}, expected a string", v.type_description()),
                )
            })?;
            texts.push(s.to_string());
        }
        let n = texts.len();
        let scores = match file.get(SCORES) {
            None => vec![0.0; n],
            Some(v) => numbers(SCORES, v, n)?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
        };
        let attrs = match file.get(TYPES) {
            None => vec![TokenAttr::NORMAL; n],
            Some(v) => integers(TYPES, v, n)?
                .into_iter()
                .map(TokenAttr::from_token_type)
                .collect(),
        };
        Self::new(texts, scores, attrs)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// The stored text of a token (byte-level BPE tokens are in GPT-2's byte alphabet,
    /// SentencePiece tokens use U+2581 for spaces).
    pub fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose stored text is exactly `text`.
    pub fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    /// The token's score (0 when the file has none).
    pub fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// The token's attributes.
    pub fn attr(&self, id: u32) -> TokenAttr {
        self.attrs.get(id as usize).copied().unwrap_or_default()
    }

    /// Replaces the token's attributes.
    pub(crate) fn set_attr(&mut self, id: u32, attr: TokenAttr) {
        if let Some(a) = self.attrs.get_mut(id as usize) {
            *a = attr;
        }
    }

    pub(crate) fn add_attr(&mut self, id: u32, attr: TokenAttr) {
        if let Some(a) = self.attrs.get_mut(id as usize) {
            *a = a.with(attr);
        }
    }
}

/// `n` numbers from an array of any numeric type.
fn numbers(key: &str, v: &Value, n: usize) -> Result<Vec<f64>, TextError> {
    let items = array_of_len(key, v, n)?;
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_f64().ok_or_else(|| {
                TextError::metadata(
                    key,
                    format!("element {i} is {}, expected a number", x.type_description()),
                )
            })
        })
        .collect()
}

/// `n` integers from an array of any integer type.
fn integers(key: &str, v: &Value, n: usize) -> Result<Vec<i128>, TextError> {
    let items = array_of_len(key, v, n)?;
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_int().ok_or_else(|| {
                TextError::metadata(
                    key,
                    format!(
                        "element {i} is {}, expected an integer",
                        x.type_description()
                    ),
                )
            })
        })
        .collect()
}

fn array_of_len<'a>(key: &str, v: &'a Value, n: usize) -> Result<&'a [Value], TextError> {
    let items = v.as_array().ok_or_else(|| {
        TextError::metadata(
            key,
            format!("is {}, expected an array", v.type_description()),
        )
    })?;
    if items.len() < n {
        return Err(TextError::metadata(
            key,
            format!("has {} elements, expected one per token ({n})", items.len()),
        ));
    }
    Ok(&items[..n])
}
