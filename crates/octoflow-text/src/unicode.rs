//! The character classes the pre-tokenizers need: letters (`\p{L}`), numbers (`\p{N}`) and
//! white space (Unicode's White_Space property, which is both Rust's `char::is_whitespace` and
//! llama.cpp's whitespace set). The letter and number tables come from `regex-syntax`, the same
//! Unicode tables the `regex` crate matches `\p{L}` and `\p{N}` with, so the hand-written
//! splitters and the regex-based ones agree on every character.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

/// What a character is, as far as the GPT-2-style split patterns care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CharClass {
    /// `\p{L}`
    Letter,
    /// `\p{N}`
    Number,
    /// `\s`
    Space,
    /// Everything else: `[^\s\p{L}\p{N}]`.
    Other,
}

struct Tables {
    letter: Vec<(char, char)>,
    number: Vec<(char, char)>,
}

/// The classes as of Unicode 15.1, the version of llama.cpp's tables (`unicode-data.cpp`): a
/// letter assigned later is unassigned there, so it splits as a symbol would.
fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| Tables {
        letter: class_ranges(r"[\p{L}&&\p{Age=V15_1}]"),
        number: class_ranges(r"[\p{N}&&\p{Age=V15_1}]"),
    })
}

/// The ranges of a Unicode class; the patterns are constants, so failing here is a bug in this
/// file, caught by `letter_and_number_tables_are_loaded`.
fn class_ranges(pattern: &str) -> Vec<(char, char)> {
    let parsed = regex_syntax::ParserBuilder::new().build().parse(pattern);
    match parsed.as_ref().map(|hir| hir.kind()) {
        Ok(HirKind::Class(Class::Unicode(class))) => class
            .ranges()
            .iter()
            .map(|r| (r.start(), r.end()))
            .collect(),
        _ => Vec::new(),
    }
}

fn in_ranges(ranges: &[(char, char)], c: char) -> bool {
    ranges
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Classifies one character.
pub(crate) fn class_of(c: char) -> CharClass {
    if c.is_ascii() {
        return if c.is_ascii_alphabetic() {
            CharClass::Letter
        } else if c.is_ascii_digit() {
            CharClass::Number
        } else if c.is_ascii_whitespace() || c == '\x0b' {
            CharClass::Space
        } else {
            CharClass::Other
        };
    }
    if c.is_whitespace() {
        return CharClass::Space;
    }
    let t = tables();
    if in_ranges(&t.letter, c) {
        CharClass::Letter
    } else if in_ranges(&t.number, c) {
        CharClass::Number
    } else {
        CharClass::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letter_and_number_tables_are_loaded() {
        assert!(tables().letter.len() > 100);
        assert!(tables().number.len() > 50);
        // U+136AC, an Egyptian hieroglyph of Unicode 16, is not a letter in 15.1
        assert_eq!(class_of('\u{136ac}'), CharClass::Other);
        assert_eq!(class_of('\u{2ebf0}'), CharClass::Letter);
    }

    #[test]
    fn classes_agree_with_unicode_categories() {
        assert_eq!(class_of('a'), CharClass::Letter);
        assert_eq!(class_of('é'), CharClass::Letter);
        assert_eq!(class_of('日'), CharClass::Letter);
        assert_eq!(class_of('7'), CharClass::Number);
        assert_eq!(class_of('٣'), CharClass::Number); // Arabic-Indic digit three
        assert_eq!(class_of('½'), CharClass::Number);
        assert_eq!(class_of(' '), CharClass::Space);
        assert_eq!(class_of('\x0b'), CharClass::Space);
        assert_eq!(class_of('\u{3000}'), CharClass::Space);
        assert_eq!(class_of('\u{85}'), CharClass::Space);
        assert_eq!(class_of('!'), CharClass::Other);
        assert_eq!(class_of('\u{301}'), CharClass::Other); // combining acute: a mark, not a letter
        assert_eq!(class_of('🚀'), CharClass::Other);
        assert_eq!(class_of('\u{1c}'), CharClass::Other); // not White_Space
    }
}
