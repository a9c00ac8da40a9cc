//! Pre-tokenizers of byte-level BPE vocabularies: they cut text into words before BPE merges run
//! inside each word. `tokenizer.ggml.pre` names the scheme; each scheme is a list of split steps
//! applied in turn, every step cutting each piece of the previous step into its matches and the
//! text between matches (nothing is dropped), as llama.cpp's `unicode_regex_split` does.
//!
//! The two look-ahead patterns (GPT-2's and Llama 3's / Qwen 2's, which end in `\s+(?!\S)`) are
//! matched by hand-written scanners that implement the regex semantics exactly, in linear time
//! and without a backtracking limit; the simple patterns use the `regex` crate.

use std::ops::Range;

use regex::Regex;

use crate::error::TextError;
use crate::unicode::{class_of, CharClass};

/// One split step.
#[derive(Debug)]
enum Step {
    /// A pattern without look-around, run by the `regex` crate.
    Regex(Regex),
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|`
    /// `\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// (Llama 3 with `max_digits` 3, Qwen 2 with 1).
    Llama3 { max_digits: usize },
    /// GPT-4o's (o200k) pattern as llama.cpp runs it, where the case classes are
    /// `(?=\p{L})[^a-z]` and `(?=\p{L})[^A-Z]` (so a non-ASCII letter is of both cases and a
    /// combining mark of neither), the contraction suffix `'s|'t|'re|'ve|'m|'ll|'d` any case:
    /// `[^\r\n\p{L}\p{N}]?U*L+'x?|[^\r\n\p{L}\p{N}]?U+L*'x?|\p{N}{1,3}|`
    /// ` ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Gpt4o,
}

/// A named pre-tokenizer and the vocabulary flags that come with its name in llama.cpp.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
    /// Whole words that are tokens skip BPE (Llama 3 family).
    pub(crate) ignore_merges: bool,
    /// Whether BOS is added when the metadata does not say (Llama 3 family).
    pub(crate) default_add_bos: bool,
}

/// The `tokenizer.ggml.pre` values we implement, grouped by scheme.
const SUPPORTED: &[(&str, &[&str])] = &[
    ("default", &["default", ""]),
    (
        "llama3",
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
        ],
    ),
    ("llama3-regex", &["dbrx", "smaug-bpe"]),
    (
        "qwen2",
        &["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"],
    ),
    (
        "smollm",
        &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva-7b",
        ],
    ),
    (
        "gpt2",
        &[
            "gpt2",
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
            "mellum",
            "a.x-4.0",
        ],
    ),
    ("falcon", &["falcon"]),
    ("gpt-4o", &["gpt-4o"]),
];

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value. A missing value (`""`) means
    /// `default`, as in llama.cpp; an unknown one is an error listing the supported names.
    pub(crate) fn for_name(pre: &str) -> Result<Self, TextError> {
        let scheme = SUPPORTED
            .iter()
            .find(|(_, names)| names.contains(&pre))
            .map(|(scheme, _)| *scheme)
            .ok_or_else(|| TextError::UnsupportedPre {
                found: pre.to_string(),
                supported: SUPPORTED
                    .iter()
                    .flat_map(|(_, names)| names.iter().filter(|n| !n.is_empty()))
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let mut ignore_merges = false;
        let mut default_add_bos = false;
        let steps = match scheme {
            "default" => vec![
                regex(r"[\p{P}\$\+<=>\^~\|]+")?,
                Step::Gpt2,
                regex(r"\p{N}+")?,
                regex(r"[0-9][0-9][0-9]")?,
            ],
            "llama3" => {
                ignore_merges = true;
                default_add_bos = true;
                vec![Step::Llama3 { max_digits: 3 }]
            }
            "llama3-regex" => vec![Step::Llama3 { max_digits: 3 }],
            "qwen2" => vec![Step::Llama3 { max_digits: 1 }],
            "smollm" => vec![regex(r"\p{N}")?, Step::Gpt2],
            "gpt2" => vec![Step::Gpt2],
            "gpt-4o" => vec![Step::Gpt4o],
            _ => vec![
                regex(r"[\p{P}\$\+<=>\^~\|`]+")?,
                Step::Gpt2,
                regex(r"[0-9][0-9][0-9]")?,
            ],
        };
        Ok(Self {
            steps,
            ignore_merges,
            default_add_bos,
        })
    }

    /// Cuts `text` into words: consecutive, non-empty byte ranges covering all of `text`.
    pub(crate) fn split(&self, text: &str) -> Vec<Range<usize>> {
        let mut pieces: Vec<Range<usize>> = Vec::new();
        if !text.is_empty() {
            pieces.push(0..text.len());
        }
        let mut chars = Vec::new();
        for step in &self.steps {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                let s = &text[piece.clone()];
                let before = next.len();
                match step {
                    Step::Regex(re) => split_regex(re, s, &mut next),
                    Step::Gpt2 => split_scanned(s, &mut chars, &mut next, gpt2_match),
                    Step::Gpt4o => split_scanned(s, &mut chars, &mut next, gpt4o_match),
                    Step::Llama3 { max_digits } => {
                        split_scanned(s, &mut chars, &mut next, |cs, i| {
                            llama3_match(cs, i, *max_digits)
                        })
                    }
                }
                for r in &mut next[before..] {
                    *r = r.start + piece.start..r.end + piece.start;
                }
            }
            pieces = next;
        }
        pieces
    }
}

/// A step for one of the constant patterns above (`every_supported_name_builds` compiles them all).
fn regex(pattern: &str) -> Result<Step, TextError> {
    Regex::new(pattern).map(Step::Regex).map_err(|e| {
        TextError::metadata(
            "tokenizer.ggml.pre",
            format!("split pattern {pattern:?} does not compile: {e}"),
        )
    })
}

/// Matches and the gaps between them, relative to `s`.
fn split_regex(re: &Regex, s: &str, out: &mut Vec<Range<usize>>) {
    let mut last = 0;
    for m in re.find_iter(s) {
        if m.start() > last {
            out.push(last..m.start());
        }
        out.push(m.range());
        last = m.end();
    }
    if last < s.len() {
        out.push(last..s.len());
    }
}

/// Runs a scanner that, at char index `i`, returns the char index where the piece starting at
/// `i` ends (always > `i`: each pattern here matches, or leaves a one-char gap, at every position).
fn split_scanned(
    s: &str,
    chars: &mut Vec<(usize, char)>,
    out: &mut Vec<Range<usize>>,
    scan: impl Fn(&[(usize, char)], usize) -> usize,
) {
    chars.clear();
    chars.extend(s.char_indices());
    let byte_at = |i: usize| chars.get(i).map_or(s.len(), |&(b, _)| b);
    let mut i = 0;
    while i < chars.len() {
        let end = scan(chars, i).max(i + 1);
        out.push(byte_at(i)..byte_at(end));
        i = end;
    }
}

fn class_at(cs: &[(usize, char)], i: usize) -> Option<CharClass> {
    cs.get(i).map(|&(_, c)| class_of(c))
}

/// End of the run of characters of class `class` starting at `i`.
fn run_end(cs: &[(usize, char)], mut i: usize, class: CharClass) -> usize {
    while class_at(cs, i) == Some(class) {
        i += 1;
    }
    i
}

/// `\s+(?!\S)|\s+` at `i` (a white-space character): the run, less its last character when a
/// non-space follows and the run is longer than one.
fn trailing_space_end(cs: &[(usize, char)], i: usize) -> usize {
    let q = run_end(cs, i, CharClass::Space);
    if q < cs.len() && q - i >= 2 {
        q - 1
    } else {
        q
    }
}

/// `\s*[\r\n]+|\s+(?!\S)|\s+` at `i` (a white-space character): up to and including the
/// run's last line break if it has one, else [`trailing_space_end`].
fn line_space_end(cs: &[(usize, char)], i: usize) -> usize {
    let q = run_end(cs, i, CharClass::Space);
    if let Some(k) = (i..q).rev().find(|&k| matches!(cs[k].1, '\r' | '\n')) {
        return k + 1;
    }
    trailing_space_end(cs, i)
}

/// GPT-2's pattern at char `i`.
fn gpt2_match(cs: &[(usize, char)], i: usize) -> usize {
    let c = cs[i].1;
    let next = cs.get(i + 1).map(|&(_, c)| c);
    if c == '\'' {
        match (next, cs.get(i + 2).map(|&(_, c)| c)) {
            (Some('s' | 't' | 'm' | 'd'), _) => return i + 2,
            (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => return i + 3,
            _ => {}
        }
    }
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the classes are disjoint, so one run.
    if c == ' ' {
        if let Some(class) = class_at(cs, i + 1).filter(|&k| k != CharClass::Space) {
            return run_end(cs, i + 1, class);
        }
    }
    let class = class_of(c);
    if class != CharClass::Space {
        return run_end(cs, i, class);
    }
    // `\s+(?!\S)`; a single space before a non-space matches nothing and is left as a gap.
    trailing_space_end(cs, i)
}

/// The Llama 3 / Qwen 2 pattern at char `i`.
fn llama3_match(cs: &[(usize, char)], i: usize, max_digits: usize) -> usize {
    let c = cs[i].1;
    let lower = |k: usize| cs.get(k).map(|&(_, c)| c.to_ascii_lowercase());
    if c == '\'' {
        match (lower(i + 1), lower(i + 2)) {
            (Some('s' | 't' | 'm' | 'd'), _) => return i + 2,
            (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => return i + 3,
            _ => {}
        }
    }
    let class = class_of(c);
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if class == CharClass::Letter {
        return run_end(cs, i, CharClass::Letter);
    }
    if c != '\r'
        && c != '\n'
        && class != CharClass::Number
        && class_at(cs, i + 1) == Some(CharClass::Letter)
    {
        return run_end(cs, i + 1, CharClass::Letter);
    }
    // `\p{N}{1,max_digits}`
    if class == CharClass::Number {
        let mut end = i;
        while end < i + max_digits && class_at(cs, end) == Some(CharClass::Number) {
            end += 1;
        }
        return end;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let start = if c == ' ' && class_at(cs, i + 1) == Some(CharClass::Other) {
        i + 1
    } else {
        i
    };
    if class_at(cs, start) == Some(CharClass::Other) {
        let mut end = run_end(cs, start, CharClass::Other);
        while matches!(cs.get(end), Some((_, '\r' | '\n'))) {
            end += 1;
        }
        return end;
    }
    // `\s*[\r\n]+`: up to and including the run's last line break.
    line_space_end(cs, i)
}

/// GPT-4o's upper-case letter class as llama.cpp matches it, `(?=\p{L})[^a-z]`: a letter that
/// is not an ASCII lower-case one (every non-ASCII letter counts as both cases there).
fn upper_at(cs: &[(usize, char)], i: usize) -> bool {
    cs.get(i)
        .is_some_and(|&(_, c)| class_of(c) == CharClass::Letter && !c.is_ascii_lowercase())
}

/// The lower-case class, `(?=\p{L})[^A-Z]`.
fn lower_at(cs: &[(usize, char)], i: usize) -> bool {
    cs.get(i)
        .is_some_and(|&(_, c)| class_of(c) == CharClass::Letter && !c.is_ascii_uppercase())
}

/// `[^\s\p{L}\p{N}]` at `i` (combining marks included: they are not letters here).
fn other_at(cs: &[(usize, char)], i: usize) -> bool {
    class_at(cs, i) == Some(CharClass::Other)
}

/// The end of `upper* lower+` at `s`, as a backtracking matcher finds it: the longest run of
/// upper-case letters that a lower-case letter still follows, then every lower-case letter.
fn upper_then_lower(cs: &[(usize, char)], s: usize) -> Option<usize> {
    let mut k = s;
    while upper_at(cs, k) {
        k += 1;
    }
    let k = (s..=k).rev().find(|&k| lower_at(cs, k))?;
    let mut end = k;
    while lower_at(cs, end) {
        end += 1;
    }
    Some(end)
}

/// The end of `upper+ lower*` at `s`.
fn upper_run_then_lower(cs: &[(usize, char)], s: usize) -> Option<usize> {
    let mut end = s;
    while upper_at(cs, end) {
        end += 1;
    }
    if end == s {
        return None;
    }
    while lower_at(cs, end) {
        end += 1;
    }
    Some(end)
}

/// The GPT-4o pattern (`Step::Gpt4o`) at char `i`.
fn gpt4o_match(cs: &[(usize, char)], i: usize) -> usize {
    let c = cs[i].1;
    let class = class_of(c);
    // `[^\r\n\p{L}\p{N}]?` before either letter alternative
    let letters_from = if class == CharClass::Letter {
        Some(i)
    } else if c != '\r' && c != '\n' && class != CharClass::Number {
        Some(i + 1)
    } else {
        None
    };
    let letters_end =
        letters_from.and_then(|s| upper_then_lower(cs, s).or_else(|| upper_run_then_lower(cs, s)));
    if let Some(end) = letters_end {
        let lower = |k: usize| cs.get(k).map(|&(_, c)| c.to_ascii_lowercase());
        if lower(end) == Some('\'') {
            match (lower(end + 1), lower(end + 2)) {
                (Some('s' | 't' | 'm' | 'd'), _) => return end + 2,
                (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => return end + 3,
                _ => {}
            }
        }
        return end;
    }
    // `\p{N}{1,3}`
    if class == CharClass::Number {
        let mut end = i;
        while end < i + 3 && class_at(cs, end) == Some(CharClass::Number) {
            end += 1;
        }
        return end;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    let start = if c == ' ' && other_at(cs, i + 1) {
        i + 1
    } else {
        i
    };
    if other_at(cs, start) {
        let mut end = run_end(cs, start, CharClass::Other);
        while matches!(cs.get(end), Some((_, '\r' | '\n' | '/'))) {
            end += 1;
        }
        return end;
    }
    // `\s*[\r\n]+`, then `\s+(?!\S)|\s+`
    line_space_end(cs, i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words<'a>(pre: &str, text: &'a str) -> Vec<&'a str> {
        let p = PreTokenizer::for_name(pre).unwrap();
        p.split(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn every_supported_name_builds() {
        for (_, names) in SUPPORTED {
            for name in *names {
                let p = PreTokenizer::for_name(name).unwrap();
                assert!(!p.steps.is_empty(), "{name}");
            }
        }
    }

    #[test]
    fn unknown_pre_is_an_error_listing_supported_names() {
        let err = PreTokenizer::for_name("klingon").unwrap_err().to_string();
        assert!(err.contains("\"klingon\""), "{err}");
        assert!(
            err.contains("qwen2") && err.contains("smollm") && err.contains("llama-bpe"),
            "{err}"
        );
    }

    #[test]
    fn gpt2_keeps_one_space_before_a_word_and_the_rest_apart() {
        assert_eq!(words("gpt2", "a   b"), ["a", "  ", " b"]);
        assert_eq!(words("gpt2", "a  "), ["a", "  "]);
        assert_eq!(words("gpt2", "x\ty"), ["x", "\t", "y"]);
        assert_eq!(words("gpt2", "I'm 12ab!?"), ["I", "'m", " 12", "ab", "!?"]);
        assert_eq!(words("gpt2", "THEY'RE"), ["THEY", "'", "RE"]);
    }

    #[test]
    fn smollm_splits_every_digit_before_gpt2() {
        assert_eq!(words("smollm", "x 123"), ["x", " ", "1", "2", "3"]);
    }

    #[test]
    fn qwen2_splits_digits_singly_and_keeps_line_breaks_together() {
        assert_eq!(
            words("qwen2", "ab 12\n\n  cd"),
            ["ab", " ", "1", "2", "\n\n", " ", " cd"]
        );
        assert_eq!(words("qwen2", "THEY'RE x"), ["THEY", "'RE", " x"]);
        assert_eq!(words("qwen2", "a.\n\nb"), ["a", ".\n\n", "b"]);
        assert_eq!(words("qwen2", "  \n x"), ["  \n", " x"]);
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(words("llama-bpe", "1234567"), ["123", "456", "7"]);
        assert_eq!(
            words("gpt-4o", "HelloWorld ABCdef éCOLE I'LL 12345 a/b//\n\n  x"),
            [
                "Hello", "World", " ABCdef", " é", "COLE", " I'LL", " ", "123", "45", " a", "/b",
                "//\n\n", " ", " x"
            ]
        );
    }

    #[test]
    fn pieces_cover_the_text() {
        let text = "Hello,  world!\n\n\tTabs 123 ½ 日本語 🚀  end ";
        for (_, names) in SUPPORTED {
            let got: String = words(names[0], text).concat();
            assert_eq!(got, text, "pre {}", names[0]);
        }
    }
}
