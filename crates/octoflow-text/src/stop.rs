//! Stop strings over streamed text: text is released as soon as it cannot be the start of a stop
//! string, and generation ends at the first stop string (which is not emitted), as OpenAI's `stop`
//! and llama.cpp's reverse prompts behave.

/// Watches streamed text for stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What [`StopMatcher::push`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is final and can be shown.
    pub emit: String,
    /// A stop string was found; nothing after it will be emitted.
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for these stop strings (empty strings are ignored).
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopStep {
        self.held.push_str(text);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            let emit = self.held[..at].to_string();
            self.held.clear();
            return StopStep {
                emit,
                stopped: true,
            };
        }
        let keep = self.longest_partial_suffix();
        let cut = self.held.len() - keep;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopStep {
            emit,
            stopped: false,
        }
    }

    /// Releases what was held back (generation ended for another reason).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of the held text that is a proper prefix of a stop
    /// string (always on a character boundary).
    fn longest_partial_suffix(&self) -> usize {
        let mut best = 0;
        for (start, _) in self.held.char_indices() {
            let suffix = &self.held[start..];
            if self
                .stops
                .iter()
                .any(|s| s.len() > suffix.len() && s.starts_with(suffix))
            {
                best = best.max(suffix.len());
                break;
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()));
        let mut out = String::new();
        for p in pieces {
            let step = m.push(p);
            out += &step.emit;
            if step.stopped {
                return (out, true);
            }
        }
        out += &m.finish();
        (out, false)
    }

    #[test]
    fn stop_string_split_across_pieces_is_caught_and_not_emitted() {
        assert_eq!(
            stream(&["\n\n"], &["Paris.", "\n", "\nThe"]),
            ("Paris.".into(), true)
        );
        assert_eq!(stream(&["END"], &["a E", "N", "D b"]), ("a ".into(), true));
    }

    #[test]
    fn partial_match_that_does_not_complete_is_released() {
        assert_eq!(stream(&["END"], &["a EN", "x"]), ("a ENx".into(), false));
        assert_eq!(stream(&["END"], &["a EN"]), ("a EN".into(), false));
    }

    #[test]
    fn text_is_released_as_early_as_possible() {
        let mut m = StopMatcher::new(["<|im_end|>".to_string()]);
        assert_eq!(m.push("Hello <|im").emit, "Hello ");
        assert_eq!(m.push("_end|> more").emit, "");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_unicode_is_safe() {
        assert_eq!(stream(&["b", "a"], &["xyzab"]), ("xyz".into(), true));
        assert_eq!(stream(&["é!"], &["café", "?"]), ("café?".into(), false));
    }
}
