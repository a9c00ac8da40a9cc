//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): text is cut into words by the
//! pre-tokenizer, each word's bytes are spelled in GPT-2's byte alphabet (every byte is one
//! printable character), and the ranked merges of `tokenizer.ggml.merges` ("left right", rank =
//! position in the list) are applied lowest rank first, leftmost first among equal ranks.
//!
//! Symbols are interned strings: vocabulary tokens keep their ids, and merge results or byte
//! characters that are not tokens get ids from `n_vocab` up, so that merging compares integers.
//! A final symbol that is not a token falls back to the tokens of its single ASCII characters,
//! as llama.cpp does (this happens only with incomplete vocabularies).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::hash::FxHashMap;

use octoflow_gguf::GgufFile;

use crate::error::TextError;
use crate::pretokenize::PreTokenizer;
use crate::vocab::Vocab;

const fn printable(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)
}

/// The 68 bytes that GPT-2's alphabet does not spell as themselves, in order.
const NON_PRINTABLE: [u8; 68] = {
    let mut table = [0u8; 68];
    let (mut b, mut n) = (0u32, 0usize);
    while b < 256 {
        if !printable(b) {
            table[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    table
};

/// The character GPT-2's byte-level alphabet uses for each byte: printable Latin-1 bytes stand
/// for themselves, the n-th of the other 68 bytes is U+0100 + n.
pub(crate) fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    for (b, slot) in table.iter_mut().enumerate() {
        *slot = char::from_u32(b as u32).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    for (n, &b) in NON_PRINTABLE.iter().enumerate() {
        table[b as usize] = char::from_u32(0x100 + n as u32).unwrap_or(char::REPLACEMENT_CHARACTER);
    }
    table
}

/// Maps a character of GPT-2's byte alphabet back to its byte.
pub(crate) fn byte_of_char(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 0x100 {
        return printable(cp).then_some(cp as u8);
    }
    NON_PRINTABLE.get((cp - 0x100) as usize).copied()
}

/// A merge: its rank and the symbol it produces.
#[derive(Debug, Clone, Copy)]
struct Merge {
    rank: u32,
    merged: u32,
}

/// The byte-level BPE model.
#[derive(Debug)]
pub(crate) struct BpeModel {
    pub(crate) pre: PreTokenizer,
    n_vocab: u32,
    /// Symbol of each byte's one-character text.
    byte_symbol: [u32; 256],
    /// (left symbol, right symbol) -> merge.
    merges: FxHashMap<(u32, u32), Merge>,
    /// Texts of symbols that are not tokens; symbol `n_vocab + i` is `extra[i]`.
    extra: Vec<String>,
    byte_chars: [char; 256],
}

impl BpeModel {
    /// Reads `tokenizer.ggml.merges`; `pre` is the pre-tokenizer named by `tokenizer.ggml.pre`.
    pub(crate) fn from_gguf(
        file: &GgufFile,
        vocab: &Vocab,
        pre: PreTokenizer,
    ) -> Result<Self, TextError> {
        const MERGES: &str = "tokenizer.ggml.merges";
        let list = file.get_array(MERGES)?;
        let mut merges = Vec::with_capacity(list.len());
        for (i, v) in list.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| {
                TextError::metadata(
                    MERGES,
                    format!("element {i} is {}, expected a string", v.type_description()),
                )
            })?;
            merges.push(s);
        }
        Ok(Self::new(vocab, &merges, pre))
    }

    /// Builds the model from merge lines `"left right"`. A line without a separating space
    /// (searched from the second byte on, as a token may itself be a space) is ignored; of
    /// duplicate pairs the first rank counts.
    pub(crate) fn new(vocab: &Vocab, merge_lines: &[&str], pre: PreTokenizer) -> Self {
        let byte_chars = byte_chars();
        let mut interner = Interner {
            vocab,
            extra: Vec::new(),
            extra_ids: FxHashMap::default(),
        };
        let mut byte_symbol = [0u32; 256];
        for (b, slot) in byte_symbol.iter_mut().enumerate() {
            *slot = interner.intern(&byte_chars[b].to_string());
        }
        let mut merges = FxHashMap::with_capacity_and_hasher(merge_lines.len(), Default::default());
        for (rank, line) in merge_lines.iter().enumerate() {
            let space = line.as_bytes().iter().skip(1).position(|&b| b == b' ');
            let Some(pos) = space.map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&line[..pos], &line[pos + 1..]);
            let key = (interner.intern(left), interner.intern(right));
            let merged = interner.intern(&format!("{left}{right}"));
            merges.entry(key).or_insert(Merge {
                rank: rank as u32,
                merged,
            });
        }
        Self {
            pre,
            n_vocab: vocab.len() as u32,
            byte_symbol,
            merges,
            extra: interner.extra,
            byte_chars,
        }
    }

    /// Whether byte `b` survives encoding: its alphabet character is a token, or is ASCII with a
    /// token of its own.
    pub(crate) fn encodes_byte(&self, b: u8) -> bool {
        self.byte_symbol[b as usize] < self.n_vocab
    }

    /// Appends the tokens of `text` (no special tokens in it) to `out`. `cache` holds the tokens
    /// of words seen before in the same call.
    pub(crate) fn encode<'t>(
        &self,
        vocab: &Vocab,
        text: &'t str,
        out: &mut Vec<u32>,
        cache: &mut FxHashMap<&'t str, Vec<u32>>,
    ) {
        for range in self.pre.split(text) {
            let word = &text[range];
            if let Some(ids) = cache.get(word) {
                out.extend_from_slice(ids);
                continue;
            }
            let start = out.len();
            self.encode_word(vocab, word.as_bytes(), out);
            cache.insert(word, out[start..].to_vec());
        }
    }

    fn encode_word(&self, vocab: &Vocab, word: &[u8], out: &mut Vec<u32>) {
        if self.pre.ignore_merges {
            let spelled: String = word.iter().map(|&b| self.byte_chars[b as usize]).collect();
            if let Some(id) = vocab.id(&spelled) {
                out.push(id);
                return;
            }
        }
        let symbols: Vec<u32> = word.iter().map(|&b| self.byte_symbol[b as usize]).collect();
        for symbol in self.merge(symbols) {
            if symbol < self.n_vocab {
                out.push(symbol);
                continue;
            }
            let text = &self.extra[(symbol - self.n_vocab) as usize];
            let mut buf = [0u8; 4];
            out.extend(
                text.chars()
                    .filter(char::is_ascii)
                    .filter_map(|c| vocab.id(c.encode_utf8(&mut buf))),
            );
        }
    }

    /// Applies merges to a word's symbols until none applies.
    fn merge(&self, mut symbols: Vec<u32>) -> Vec<u32> {
        const NONE: u32 = u32::MAX;
        let n = symbols.len();
        if n < 2 {
            return symbols;
        }
        // A doubly linked list over `symbols`; a merged-away symbol becomes NONE.
        let mut next: Vec<u32> = (1..=n as u32)
            .map(|i| if i as usize == n { NONE } else { i })
            .collect();
        let mut prev: Vec<u32> = (0..n as u32).map(|i| i.wrapping_sub(1)).collect();
        // (rank, left position, left symbol, right symbol, merged symbol); min-heap by rank then
        // position. An entry is stale when its pair is no longer adjacent with those symbols.
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, symbols: &[u32], l: u32, r: u32| {
            if l == NONE || r == NONE {
                return;
            }
            let key = (symbols[l as usize], symbols[r as usize]);
            if let Some(m) = self.merges.get(&key) {
                heap.push(Reverse((m.rank, l, key.0, key.1, m.merged)));
            }
        };
        for i in 0..n as u32 - 1 {
            push(&mut heap, &symbols, i, i + 1);
        }
        while let Some(Reverse((_, l, left, right, merged))) = heap.pop() {
            let r = next[l as usize];
            if r == NONE || symbols[l as usize] != left || symbols[r as usize] != right {
                continue;
            }
            symbols[l as usize] = merged;
            symbols[r as usize] = NONE;
            let after = next[r as usize];
            next[l as usize] = after;
            if after != NONE {
                prev[after as usize] = l;
            }
            push(&mut heap, &symbols, prev[l as usize], l);
            push(&mut heap, &symbols, l, after);
        }
        symbols.retain(|&s| s != NONE);
        symbols
    }
}

/// Gives every distinct string a symbol id: the token id if it is a token, else a new id.
struct Interner<'v> {
    vocab: &'v Vocab,
    extra: Vec<String>,
    extra_ids: FxHashMap<String, u32>,
}

impl Interner<'_> {
    fn intern(&mut self, text: &str) -> u32 {
        if let Some(id) = self.vocab.id(text) {
            return id;
        }
        if let Some(&id) = self.extra_ids.get(text) {
            return id;
        }
        let id = (self.vocab.len() + self.extra.len()) as u32;
        self.extra.push(text.to_string());
        self.extra_ids.insert(text.to_string(), id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::TokenAttr;

    #[test]
    fn byte_alphabet_round_trips_every_byte() {
        let chars = byte_chars();
        assert_eq!(chars[b' ' as usize], 'Ġ');
        assert_eq!(chars[b'\n' as usize], 'Ċ');
        assert_eq!(chars[b'a' as usize], 'a');
        for b in 0..=255u8 {
            assert_eq!(byte_of_char(chars[b as usize]), Some(b), "byte {b}");
        }
        assert_eq!(byte_of_char('€'), None);
    }

    fn model(tokens: &[&str], merges: &[&str]) -> (Vocab, BpeModel) {
        let vocab = Vocab::new(
            tokens.iter().map(|t| t.to_string()).collect(),
            vec![0.0; tokens.len()],
            vec![TokenAttr::NORMAL; tokens.len()],
        )
        .unwrap();
        let pre = PreTokenizer::for_name("gpt2").unwrap();
        let model = BpeModel::new(&vocab, merges, pre);
        (vocab, model)
    }

    fn encode(vocab: &Vocab, model: &BpeModel, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        model.encode(vocab, text, &mut out, &mut FxHashMap::default());
        out
    }

    #[test]
    fn lowest_rank_merges_first_and_leftmost_among_equals() {
        //              0    1    2     3      4
        let tokens = ["a", "b", "ab", "aa", "aab"];
        let (vocab, m) = model(&tokens, &["a b", "a a", "a ab"]);
        // "aab": (a,b) has rank 0 and wins over (a,a) rank 1; then (a,ab) rank 2.
        assert_eq!(encode(&vocab, &m, "aab"), [4]);
        // "aaa": only (a,a); leftmost first, leaving the last a.
        assert_eq!(encode(&vocab, &m, "aaa"), [3, 0]);
    }

    #[test]
    fn merges_split_at_the_space_after_a_multibyte_first_symbol() {
        let (vocab, m) = model(&["Ġ", "t", "Ġt"], &["Ġ t"]);
        assert_eq!(encode(&vocab, &m, " t"), [2]);
    }

    #[test]
    fn symbols_that_are_not_tokens_fall_back_to_ascii_characters() {
        // "xy" is a merge result but not a token.
        let (vocab, m) = model(&["x", "y"], &["x y"]);
        assert_eq!(encode(&vocab, &m, "xy"), [0, 1]);
    }
}
