//! Cutting special tokens out of text before the tokenizer proper runs, as llama.cpp's
//! `tokenizer_st_partition` does: user-defined tokens always, control and unknown tokens only
//! when special tokens are parsed. Candidates are tried longest text first (then lowest id), each
//! splitting every remaining text fragment at its non-overlapping occurrences, left to right.
//!
//! Trying each of thousands of candidates (Gemma has 6,400) against the whole text would cost
//! candidates × text length; an Aho-Corasick pass first finds which candidates occur at all, and
//! only those are split on, which gives the same fragments.

use std::ops::Range;

use aho_corasick::AhoCorasick;
use memchr::memmem;

use crate::error::TextError;
use crate::vocab::{TokenAttr, Vocab};

/// A piece of the input: text still to tokenize, or a special token already recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// A byte range of the input.
    Text(Range<usize>),
    /// A special token.
    Token(u32),
}

/// The special tokens of a vocabulary, ready to be found in text.
#[derive(Debug)]
pub(crate) struct SpecialMatcher {
    /// Candidate ids in priority order: longest text first, then lowest id.
    order: Vec<u32>,
    /// For each candidate, whether it is matched only when special tokens are parsed.
    needs_parse_special: Vec<bool>,
    /// Finds every occurrence of every candidate (patterns in `order`'s order).
    automaton: Option<AhoCorasick>,
}

impl SpecialMatcher {
    /// Collects control, user-defined and unknown tokens of `vocab`.
    pub(crate) fn new(vocab: &Vocab) -> Result<Self, TextError> {
        let special = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
        let mut order: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.attr(id).intersects(special))
            .collect();
        let len = |id: u32| vocab.text(id).map_or(0, str::len);
        order.sort_by(|&a, &b| len(b).cmp(&len(a)).then(a.cmp(&b)));
        let needs_parse_special = order
            .iter()
            .map(|&id| {
                vocab
                    .attr(id)
                    .intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
            })
            .collect();
        let automaton = if order.is_empty() {
            None
        } else {
            let patterns: Vec<&str> = order
                .iter()
                .map(|&id| vocab.text(id).unwrap_or_default())
                .collect();
            Some(AhoCorasick::new(patterns).map_err(|e| {
                TextError::metadata(
                    "tokenizer.ggml.tokens",
                    format!("special tokens cannot be indexed: {e}"),
                )
            })?)
        };
        Ok(Self {
            order,
            needs_parse_special,
            automaton,
        })
    }

    /// Splits `text` into fragments. Empty text gives no fragments.
    pub(crate) fn partition(
        &self,
        vocab: &Vocab,
        text: &str,
        parse_special: bool,
    ) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut fragments = vec![Fragment::Text(0..text.len())];
        let Some(automaton) = &self.automaton else {
            return fragments;
        };
        let mut present = vec![false; self.order.len()];
        for m in automaton.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        for (k, &id) in self.order.iter().enumerate() {
            if !present[k] || (self.needs_parse_special[k] && !parse_special) {
                continue;
            }
            let needle = vocab.text(id).unwrap_or_default().as_bytes();
            fragments = split_on(text.as_bytes(), fragments, needle, id);
        }
        fragments
    }
}

/// Replaces every occurrence of `needle` inside text fragments by `Token(id)`.
fn split_on(text: &[u8], fragments: Vec<Fragment>, needle: &[u8], id: u32) -> Vec<Fragment> {
    let finder = memmem::Finder::new(needle);
    let mut out = Vec::with_capacity(fragments.len() + 2);
    for fragment in fragments {
        let Fragment::Text(range) = fragment else {
            out.push(fragment);
            continue;
        };
        let mut start = range.start;
        for pos in finder.find_iter(&text[range.clone()]) {
            let at = range.start + pos;
            if at > start {
                out.push(Fragment::Text(start..at));
            }
            out.push(Fragment::Token(id));
            start = at + needle.len();
        }
        if start < range.end {
            out.push(Fragment::Text(start..range.end));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[(&str, TokenAttr)]) -> Vocab {
        Vocab::new(
            tokens.iter().map(|(t, _)| t.to_string()).collect(),
            vec![0.0; tokens.len()],
            tokens.iter().map(|(_, a)| *a).collect(),
        )
        .unwrap()
    }

    #[test]
    fn control_tokens_are_cut_out_only_when_parsing_specials() {
        let v = vocab(&[
            ("a", TokenAttr::NORMAL),
            ("<s>", TokenAttr::CONTROL),
            ("\n", TokenAttr::USER_DEFINED),
        ]);
        let m = SpecialMatcher::new(&v).unwrap();
        let text = "x<s>y\nz";
        assert_eq!(
            m.partition(&v, text, true),
            [
                Fragment::Text(0..1),
                Fragment::Token(1),
                Fragment::Text(4..5),
                Fragment::Token(2),
                Fragment::Text(6..7)
            ]
        );
        assert_eq!(
            m.partition(&v, text, false),
            [
                Fragment::Text(0..5),
                Fragment::Token(2),
                Fragment::Text(6..7)
            ]
        );
    }

    #[test]
    fn longer_special_tokens_win_over_shorter_ones() {
        let v = vocab(&[
            ("\n", TokenAttr::USER_DEFINED),
            ("\n\n", TokenAttr::USER_DEFINED),
        ]);
        let m = SpecialMatcher::new(&v).unwrap();
        assert_eq!(
            m.partition(&v, "\n\n\n", false),
            [Fragment::Token(1), Fragment::Token(0)]
        );
    }

    #[test]
    fn empty_text_has_no_fragments() {
        let v = vocab(&[("<s>", TokenAttr::CONTROL)]);
        assert!(SpecialMatcher::new(&v)
            .unwrap()
            .partition(&v, "", true)
            .is_empty());
    }
}
