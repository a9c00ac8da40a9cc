//! Streaming detokenization: tokens arrive one at a time, and a character whose UTF-8 bytes are
//! spread over several tokens (emoji, CJK in byte-level vocabularies) is emitted only when whole.
//! The concatenation of everything emitted equals [`Tokenizer::decode`] of all the tokens.

use crate::tokenizer::Tokenizer;

/// Turns a stream of token ids into text, one complete character at a time.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    /// Bytes received but not yet emitted: an incomplete UTF-8 sequence at the end.
    pending: Vec<u8>,
    /// Whether a token with text has been seen (for the leading-space rule).
    started: bool,
}

impl<'t> StreamDecoder<'t> {
    pub(crate) fn new(tokenizer: &'t Tokenizer) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
            started: false,
        }
    }

    /// Adds a token; returns the text that is now complete (possibly empty). Invalid UTF-8 is
    /// emitted as U+FFFD as soon as it is known to be invalid.
    pub fn push(&mut self, id: u32) -> String {
        let mut piece = self.tokenizer.token_to_piece(id, false);
        if piece.is_empty() {
            return String::new();
        }
        if !self.started {
            self.started = true;
            if self.tokenizer.strips_first_space() {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
        }
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // An invalid sequence: replace it, as `String::from_utf8_lossy` does.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        // A sequence cut off at the end: wait for the next token.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }

    /// Ends the stream: an incomplete sequence still pending is emitted as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Whether bytes of an incomplete character are waiting.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}
