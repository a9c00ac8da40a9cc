//! A token mask: which tokens of the vocabulary a constrained draw may take (a grammar's
//! answer for one position). One bit per token in u32 words — bit `i % 32` of word `i / 32`,
//! set means allowed — the layout llguidance computes and a device sampler reads as is.

/// Allowed tokens of one draw, `[ceil(n_vocab / 32)]` u32 words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    n_vocab: usize,
}

impl TokenMask {
    /// The mask over `n_vocab` tokens given by `words` (missing words allow nothing; bits past
    /// `n_vocab` are ignored).
    pub fn from_words(mut words: Vec<u32>, n_vocab: usize) -> Self {
        words.resize(n_vocab.div_ceil(32), 0);
        if !n_vocab.is_multiple_of(32) {
            if let Some(last) = words.last_mut() {
                *last &= (1u32 << (n_vocab % 32)) - 1;
            }
        }
        Self { words, n_vocab }
    }

    /// A mask allowing exactly `allowed` (ids past `n_vocab` are left out).
    pub fn from_allowed(allowed: impl IntoIterator<Item = u32>, n_vocab: usize) -> Self {
        let mut words = vec![0u32; n_vocab.div_ceil(32)];
        for t in allowed {
            if (t as usize) < n_vocab {
                words[t as usize / 32] |= 1 << (t % 32);
            }
        }
        Self { words, n_vocab }
    }

    /// Whether `token` may be drawn.
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.n_vocab && self.words[token as usize / 32] >> (token % 32) & 1 == 1
    }

    /// The words, `[ceil(n_vocab / 32)]`.
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Tokens covered.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The lowest allowed token, if any is.
    pub fn first_allowed(&self) -> Option<u32> {
        let (w, word) = self.words.iter().enumerate().find(|(_, w)| **w != 0)?;
        Some(w as u32 * 32 + word.trailing_zeros())
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_name_tokens_across_words() {
        let m = TokenMask::from_allowed([0, 31, 32, 69, 500], 70);
        assert_eq!(m.words().len(), 3);
        for t in [0, 31, 32, 69] {
            assert!(m.allows(t), "{t}");
        }
        for t in [1, 30, 33, 68, 70, 500] {
            assert!(!m.allows(t), "{t}");
        }
        assert_eq!(m.count(), 4);
        assert_eq!(m.first_allowed(), Some(0));
    }

    #[test]
    fn bits_past_the_vocabulary_are_dropped() {
        let m = TokenMask::from_words(vec![u32::MAX, u32::MAX], 40);
        assert_eq!(m.count(), 40);
        assert!(!m.allows(40));
        let empty = TokenMask::from_words(Vec::new(), 40);
        assert_eq!(empty.first_allowed(), None);
    }
}
