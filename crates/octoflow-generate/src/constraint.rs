//! Constrained decoding: a grammar (a JSON schema, any JSON object, a Lark grammar, a regular
//! expression) turned into a [`TokenMask`] per position, through llguidance — the maintained
//! library llama.cpp and vLLM use — so the output always parses.
//!
//! [`GrammarEnv`] is built once per tokenizer (llguidance's token trie over our vocabulary's
//! bytes); each constrained choice holds a [`Constraint`]: ask it for the mask, sample under
//! it, commit the token. Control tokens enter the trie as llguidance's special-token form
//! (`\xff` + their text), so a grammar's text can never spell them; the end-of-generation
//! tokens are the trie's EOS set, allowed exactly where the grammar may end.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use octoflow_core::TokenMask;
use octoflow_text::{TokenAttr, Tokenizer};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// Why a grammar could not be used or followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// The grammar or schema does not compile (unsupported keyword, syntax error, ...).
    #[error("{0}")]
    Compile(String),
    /// The tokenizer cannot back a grammar (no end-of-generation token, ...).
    #[error("constrained decoding is not available for this tokenizer: {0}")]
    Tokenizer(String),
    /// The grammar refused a token or failed while decoding.
    #[error("the grammar failed while decoding: {0}")]
    Decode(String),
}

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this schema (`json_schema`).
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark dialect (which embeds JSON schemas and regexes).
    Lark(String),
    /// A regular expression.
    Regex(String),
}

impl Grammar {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"}))
            }
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
        }
    }
}

/// llguidance's view of our tokenizer: the trie of token bytes, and our encoder for the text a
/// grammar forces.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Forced text is valid UTF-8 where the grammar is; elsewhere the trie's greedy split
        // gives some tokenization of the exact bytes.
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false, false),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// The grammar compiler for one tokenizer; cheap to clone and share between threads.
#[derive(Clone)]
pub struct GrammarEnv {
    factory: Arc<ParserFactory>,
    n_vocab: usize,
}

impl std::fmt::Debug for GrammarEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GrammarEnv({} tokens)", self.n_vocab)
    }
}

impl GrammarEnv {
    /// Builds the token trie of `tokenizer` (a few hundred milliseconds for a 150k vocabulary).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, ConstraintError> {
        let n_vocab = tokenizer.n_vocab();
        let special = tokenizer.special();
        let eog: Vec<u32> = special.eog.clone();
        let eos = special
            .eos
            .or(special.eot)
            .or_else(|| eog.first().copied())
            .ok_or_else(|| {
                ConstraintError::Tokenizer("it has no end-of-generation token".into())
            })?;
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                let attr = tokenizer.vocab().attr(id);
                let piece = tokenizer.token_to_piece(id, true);
                if attr.intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN) || eog.contains(&id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(piece);
                    w
                } else {
                    piece.to_vec()
                }
            })
            .collect();
        let mut info = TokRxInfo::new(n_vocab as u32, eos);
        info.tok_bos = special.bos;
        let mut trie = TokTrie::from(&info, &words);
        let mut eos_set = eog;
        if !eos_set.contains(&eos) {
            eos_set.push(eos);
        }
        trie = trie.with_eos_tokens(&eos_set);
        let env: TokEnv = Arc::new(Env { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            n_vocab,
        })
    }

    /// Compiles `grammar` into a fresh constraint at the start of the output.
    pub fn constraint(&self, grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        let parser = self
            .factory
            .create_parser(grammar.top_level())
            .map_err(|e| ConstraintError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Compile(e));
        }
        Ok(Constraint {
            matcher: Box::new(matcher),
            n_vocab: self.n_vocab,
        })
    }
}

/// One choice's grammar state: which tokens may come next, advanced token by token.
#[derive(Clone)]
pub struct Constraint {
    // boxed: the matcher is large and requests carry their constraint through queues
    matcher: Box<Matcher>,
    n_vocab: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint(stopped: {})", self.matcher.is_stopped())
    }
}

impl Constraint {
    /// The tokens allowed next (only end-of-generation tokens once the grammar is complete).
    pub fn mask(&mut self) -> Result<TokenMask, ConstraintError> {
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError::Decode(e.to_string()))?;
        let mask = TokenMask::from_words(vob.as_slice().to_vec(), self.n_vocab);
        if mask.count() == 0 {
            return Err(ConstraintError::Decode(
                "the grammar allows no token here".into(),
            ));
        }
        Ok(mask)
    }

    /// Advances past `token` (which the last mask allowed). An end-of-generation token ends
    /// the grammar; committing it is harmless.
    pub fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Decode(e.to_string()))
    }

    /// Whether the output so far is a complete match (end-of-generation would be allowed).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
#[path = "constraint_tests.rs"]
mod tests;
