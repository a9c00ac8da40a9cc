//! [`Tokenizer`]: text to token ids and back, built from a GGUF file's metadata alone, agreeing
//! with llama.cpp's `llama_tokenize` / `llama_token_to_piece`.

use crate::hash::FxHashMap;

use octoflow_gguf::GgufFile;

use crate::bpe::{byte_of_char, BpeModel};
use crate::error::TextError;
use crate::partition::{Fragment, SpecialMatcher};
use crate::pretokenize::PreTokenizer;
use crate::special::{Defaults, SpecialTokens};
use crate::spm::SpmModel;
use crate::stream::StreamDecoder;
use crate::tokenizer_json::JsonEncoder;
use crate::vocab::{TokenAttr, Vocab};

/// The space character SentencePiece vocabularies spell spaces with (U+2581).
const SPM_SPACE: &str = "\u{2581}";

/// Which algorithm turns text fragments into tokens.
#[derive(Debug)]
enum Model {
    /// Byte-level BPE (`gpt2`).
    Bpe(BpeModel),
    /// SentencePiece BPE with scores (`llama`).
    Spm(SpmModel),
}

/// A tokenizer: vocabulary, special tokens, and the model that splits text.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    special: SpecialTokens,
    model: Model,
    matcher: SpecialMatcher,
    /// The bytes each token renders as (control tokens included).
    pieces: Vec<Box<[u8]>>,
    /// `tokenizer.ggml.model`.
    model_name: String,
    /// `tokenizer.ggml.pre` (empty when absent).
    pre_name: String,
    /// A folder's `tokenizer.json`, which encodes in its place when attached.
    json: Option<JsonEncoder>,
}

impl Tokenizer {
    /// Builds the tokenizer described by `tokenizer.ggml.*` metadata: `model` `"gpt2"` (byte-level
    /// BPE with the pre-tokenizer named by `pre`) or `"llama"` (SentencePiece BPE with scores).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TextError> {
        let model_name = file.get_str("tokenizer.ggml.model")?.to_string();
        let pre_name = match file.get("tokenizer.ggml.pre") {
            None => String::new(),
            Some(v) => v
                .as_str()
                .ok_or_else(|| {
                    TextError::metadata(
                        "tokenizer.ggml.pre",
                        format!("is {}, expected a string", v.type_description()),
                    )
                })?
                .to_string(),
        };
        let mut vocab = Vocab::from_gguf(file)?;
        let (model, special) = match model_name.as_str() {
            "gpt2" => {
                let pre = PreTokenizer::for_name(&pre_name)?;
                let defaults = Defaults {
                    bos: Some(11),
                    eos: Some(11),
                    unk: None,
                    add_bos: pre.default_add_bos,
                    add_space_prefix: false,
                };
                let special = SpecialTokens::load(file, &mut vocab, defaults)?;
                (Model::Bpe(BpeModel::from_gguf(file, &vocab, pre)?), special)
            }
            "llama" => {
                let defaults = Defaults {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    add_bos: true,
                    add_space_prefix: true,
                };
                let special = SpecialTokens::load(file, &mut vocab, defaults)?;
                (Model::Spm(SpmModel::new(&vocab, special.unk)), special)
            }
            other => return Err(TextError::UnsupportedModel(other.to_string())),
        };
        Self::assemble(vocab, special, model, model_name, pre_name)
    }

    fn assemble(
        vocab: Vocab,
        special: SpecialTokens,
        model: Model,
        model_name: String,
        pre_name: String,
    ) -> Result<Self, TextError> {
        let matcher = SpecialMatcher::new(&vocab)?;
        let pieces = (0..vocab.len() as u32)
            .map(|id| render_piece(&vocab, &model, id).into_boxed_slice())
            .collect();
        Ok(Self {
            vocab,
            special,
            model,
            matcher,
            pieces,
            model_name,
            pre_name,
            json: None,
        })
    }

    /// Encodes through Hugging Face's `tokenizers` reading `path`, the `tokenizer.json` this
    /// tokenizer's metadata was converted from (a model opened from a folder): its ids are
    /// transformers' where llama.cpp's reading of the metadata would differ. Fails when the file
    /// does not load or gives a token another id than the vocabulary does.
    pub fn with_tokenizer_json(mut self, path: &std::path::Path) -> Result<Self, TextError> {
        self.json = Some(JsonEncoder::open(path, &self.vocab)?);
        Ok(self)
    }

    /// The `tokenizer.json` that encodes, when one is attached.
    pub fn tokenizer_json(&self) -> Option<&std::path::Path> {
        self.json.as_ref().map(JsonEncoder::path)
    }

    /// [`encode`](Self::encode), with an attached `tokenizer.json`'s failure returned instead of
    /// encoding by the metadata.
    pub fn try_encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TextError> {
        match &self.json {
            Some(json) => json.encode(text, add_special, parse_special),
            None => Ok(self.encode_by_metadata(text, add_special, parse_special)),
        }
    }

    /// Tokenizes `text`. With `add_special`, BOS/EOS are added as the vocabulary's flags say;
    /// with `parse_special`, control tokens written in the text (`<|im_start|>`) become their
    /// ids (user-defined tokens always do), as llama.cpp's `llama_tokenize`. With a
    /// `tokenizer.json` attached, as `tokenizers` does; in the rare case that it fails (its regex
    /// engine's backtracking limit on a pathological text), by the metadata, which gives
    /// llama.cpp's ids over the same vocabulary.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.try_encode(text, add_special, parse_special)
            .unwrap_or_else(|_| self.encode_by_metadata(text, add_special, parse_special))
    }

    fn encode_by_metadata(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let bos = self
            .special
            .bos
            .filter(|_| add_special && self.special.add_bos);
        out.extend(bos);
        let fragments = self.matcher.partition(&self.vocab, text, parse_special);
        match &self.model {
            Model::Bpe(bpe) => {
                let mut cache = FxHashMap::default();
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(r) => {
                            bpe.encode(&self.vocab, &text[r], &mut out, &mut cache)
                        }
                    }
                }
            }
            Model::Spm(spm) => {
                // A space goes before text at the start or after a special token.
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(r) => {
                            let prefix = if self.special.add_space_prefix && after_special {
                                " "
                            } else {
                                ""
                            };
                            let escaped = format!("{prefix}{}", &text[r]).replace(' ', SPM_SPACE);
                            spm.encode(&self.vocab, &escaped, &mut out);
                            after_special = false;
                        }
                    }
                }
            }
        }
        let eos = self
            .special
            .eos
            .filter(|_| add_special && self.special.add_eos);
        out.extend(eos);
        out
    }

    /// Whether byte `b` of UTF-8 text survives encoding. Byte-level vocabularies that lack a
    /// byte's character drop that byte, as llama.cpp does (SmolLM2 lacks 21, among them 0xF1,
    /// which starts the characters U+40000..U+7FFFF), so text using it does not round-trip.
    pub fn encodes_byte(&self, b: u8) -> bool {
        match &self.model {
            Model::Bpe(bpe) => bpe.encodes_byte(b),
            Model::Spm(spm) => spm.encodes_byte(b),
        }
    }

    /// The bytes token `id` stands for. Control and unknown tokens render as nothing unless
    /// `special`; ids outside the vocabulary render as U+FFFD.
    pub fn token_to_piece(&self, id: u32, special: bool) -> &[u8] {
        match self.pieces.get(id as usize) {
            None => "\u{FFFD}".as_bytes(),
            Some(_) if !special && self.is_hidden(id) => &[],
            Some(piece) => piece,
        }
    }

    fn is_hidden(&self, id: u32) -> bool {
        self.vocab
            .attr(id)
            .intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
    }

    /// The text of `ids`, control tokens left out (so a leading BOS vanishes). Bytes that are not
    /// valid UTF-8 become U+FFFD. With `add_space_prefix`, the space that encoding put before the
    /// text is taken off the first token again.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut stream = self.stream_decoder();
        let mut text = String::new();
        for &id in ids {
            text.push_str(&stream.push(id));
        }
        text.push_str(&stream.finish());
        text
    }

    /// Like [`decode`](Self::decode), but control tokens are written out (`<|im_end|>`).
    pub fn decode_with_special(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| self.token_to_piece(id, true).iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A decoder for tokens arriving one at a time that emits only complete characters.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }

    /// The vocabulary.
    pub fn vocab(&self) -> &Vocab {
        &self.vocab
    }

    /// Number of tokens.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    /// Special token ids and flags.
    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// Whether `id` ends generation (EOS, end of turn, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.special.is_eog(id)
    }

    /// `tokenizer.ggml.model` (`"gpt2"` or `"llama"`).
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// `tokenizer.ggml.pre` (empty when the file has none).
    pub fn pre_name(&self) -> &str {
        &self.pre_name
    }

    pub(crate) fn strips_first_space(&self) -> bool {
        self.special.add_space_prefix
    }
}

/// What a token renders as when special tokens are shown: control, unknown and user-defined
/// tokens as their text, byte tokens as their byte, normal tokens decoded from the model's
/// spelling (GPT-2 byte alphabet, or U+2581 for spaces), anything else (unused) as nothing.
fn render_piece(vocab: &Vocab, model: &Model, id: u32) -> Vec<u8> {
    let text = vocab.text(id).unwrap_or_default();
    let attr = vocab.attr(id);
    if attr.intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN | TokenAttr::USER_DEFINED) {
        return text.as_bytes().to_vec();
    }
    if attr.intersects(TokenAttr::NORMAL) {
        return match model {
            Model::Spm(_) => text.replace(SPM_SPACE, " ").into_bytes(),
            Model::Bpe(_) => {
                let mut bytes = Vec::with_capacity(text.len());
                for c in text.chars() {
                    match byte_of_char(c) {
                        Some(b) => bytes.push(b),
                        // Not in the byte alphabet: keep the character itself.
                        None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                bytes
            }
        };
    }
    if attr.intersects(TokenAttr::BYTE) {
        let hex = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok());
        return hex.map(|b| vec![b]).unwrap_or_default();
    }
    Vec::new()
}
