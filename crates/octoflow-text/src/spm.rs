//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`, e.g. Gemma): spaces are written
//! U+2581, the text starts as one symbol per character, and adjacent symbols whose concatenation
//! is a token merge, highest token score first (leftmost among equal scores), until no pair is a
//! token. A final symbol that is not a token (a character missing from the vocabulary) becomes
//! its bytes' `<0xNN>` tokens.
//!
//! Every merged symbol is a token by construction, so llama.cpp's re-segmentation of non-token
//! symbols through the merge history only ever reaches single characters, which are spelled as
//! bytes here directly.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

/// The SentencePiece model: only the byte-fallback table; merges come from token scores.
#[derive(Debug)]
pub(crate) struct SpmModel {
    /// Token for each byte: `<0xNN>`, else the one-byte text, else the unknown token.
    byte_tokens: [Option<u32>; 256],
}

/// A candidate merge of the symbols at `left` and `right` (byte offsets in the text).
#[derive(Debug, PartialEq)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    /// Length in bytes of the merged text, to tell a stale entry.
    size: u32,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    /// Higher score first; among equal scores the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A symbol: a byte range of the text, linked to its neighbours by their start offsets.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    len: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

impl SpmModel {
    pub(crate) fn new(vocab: &Vocab, unk: Option<u32>) -> Self {
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let raw = [b as u8];
            *slot = vocab
                .id(&format!("<0x{b:02X}>"))
                .or_else(|| std::str::from_utf8(&raw).ok().and_then(|s| vocab.id(s)))
                .or(unk);
        }
        Self { byte_tokens }
    }

    /// Whether a character missing from the vocabulary can still be spelled with byte `b`.
    pub(crate) fn encodes_byte(&self, b: u8) -> bool {
        self.byte_tokens[b as usize].is_some()
    }

    /// Appends the tokens of `text` (spaces already written as U+2581) to `out`.
    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        // Symbols are indexed by their start byte; only char starts are used.
        let mut symbols = vec![
            Symbol {
                len: 0,
                prev: NONE,
                next: NONE
            };
            text.len()
        ];
        let starts: Vec<u32> = text.char_indices().map(|(i, _)| i as u32).collect();
        for (k, &s) in starts.iter().enumerate() {
            let end = starts.get(k + 1).copied().unwrap_or(text.len() as u32);
            symbols[s as usize] = Symbol {
                len: end - s,
                prev: if k == 0 { NONE } else { starts[k - 1] },
                next: if k + 1 == starts.len() { NONE } else { end },
            };
        }
        let mut heap = BinaryHeap::new();
        for pair in starts.windows(2) {
            self.push_bigram(vocab, text, &symbols, pair[0], pair[1], &mut heap);
        }
        while let Some(b) = heap.pop() {
            let (l, r) = (symbols[b.left as usize], symbols[b.right as usize]);
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            symbols[b.left as usize].len = b.size;
            symbols[b.left as usize].next = r.next;
            symbols[b.right as usize].len = 0;
            if r.next != NONE {
                symbols[r.next as usize].prev = b.left;
            }
            self.push_bigram(vocab, text, &symbols, l.prev, b.left, &mut heap);
            self.push_bigram(vocab, text, &symbols, b.left, r.next, &mut heap);
        }
        let mut at = 0u32;
        while at != NONE {
            let sym = symbols[at as usize];
            let piece = &text[at as usize..(at + sym.len) as usize];
            match vocab.id(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.byte_tokens[b as usize])),
            }
            at = sym.next;
        }
    }

    fn push_bigram(
        &self,
        vocab: &Vocab,
        text: &str,
        symbols: &[Symbol],
        left: u32,
        right: u32,
        heap: &mut BinaryHeap<Bigram>,
    ) {
        if left == NONE || right == NONE {
            return;
        }
        let size = symbols[left as usize].len + symbols[right as usize].len;
        let merged = &text[left as usize..(left + size) as usize];
        if let Some(id) = vocab.id(merged) {
            heap.push(Bigram {
                score: vocab.score(id),
                left,
                right,
                size,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::TokenAttr;

    fn vocab(tokens: &[(&str, f32)]) -> Vocab {
        Vocab::new(
            tokens.iter().map(|(t, _)| t.to_string()).collect(),
            tokens.iter().map(|(_, s)| *s).collect(),
            vec![TokenAttr::NORMAL; tokens.len()],
        )
        .unwrap()
    }

    #[test]
    fn highest_score_merges_first() {
        //                0          1          2          3           4
        let v = vocab(&[
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", -2.0),
            ("bc", -1.0),
        ]);
        let mut out = Vec::new();
        SpmModel::new(&v, None).encode(&v, "abc", &mut out);
        assert_eq!(out, [0, 4]);
    }

    #[test]
    fn missing_characters_fall_back_to_byte_tokens() {
        let mut tokens: Vec<(String, f32)> =
            (0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0)).collect();
        tokens.push(("x".into(), 0.0));
        let v = Vocab::new(
            tokens.iter().map(|(t, _)| t.clone()).collect(),
            vec![0.0; tokens.len()],
            vec![TokenAttr::BYTE; tokens.len()],
        )
        .unwrap();
        let mut out = Vec::new();
        SpmModel::new(&v, None).encode(&v, "xé", &mut out);
        assert_eq!(out, [256, 0xC3, 0xA9]);
    }
}
