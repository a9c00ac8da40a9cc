//! Context shift: a session that fills keeps its first tokens and the newer half of the rest and
//! goes on instead of ending, as llama.cpp's `--context-shift` does. The kept tokens after the
//! first ones are fed again (one prefill of at most half the context) rather than rotating the
//! cached keys to their new positions, so the session then holds exactly what a fresh session
//! fed the kept tokens would hold, on every backend and cache layout alike.

use octoflow_model::Forward;

use crate::error::GenerateError;
use crate::prompt::PREFILL_CHUNK;

/// The tokens a session holds, so that it can be shifted when it fills.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextShift {
    /// Tokens at the start that every shift keeps (the BOS, a system prompt).
    pub keep: usize,
    /// Every token the session holds, in order.
    pub held: Vec<u32>,
    /// Shifts made so far.
    pub shifts: usize,
}

impl ContextShift {
    /// For a session that holds nothing yet.
    pub fn new(keep: usize) -> Self {
        Self {
            keep,
            held: Vec::new(),
            shifts: 0,
        }
    }

    /// `tokens` shortened until `room` more positions fit in a context of `n_ctx`: the first
    /// [`keep`](Self::keep) stay, and the oldest half of the rest is dropped as often as needed
    /// (llama.cpp's `n_discard = (n_past - n_keep) / 2`). `keep` is capped at half of what may be
    /// held, so that a shift always frees room.
    pub fn fit(&self, tokens: &[u32], n_ctx: usize, room: usize) -> Vec<u32> {
        let limit = n_ctx.saturating_sub(room);
        let keep = self.keep.min(limit / 2);
        let mut out = tokens.to_vec();
        while out.len() > limit {
            let discard = ((out.len() - keep) / 2).max(1);
            out.drain(keep..keep + discard);
        }
        out
    }

    /// Makes `session` (which holds [`held`](Self::held)) able to take `room` more tokens: when
    /// it cannot, it keeps [`fit`](Self::fit)'s tokens, feeding again those after the part it
    /// still holds. Returns whether it shifted.
    pub fn make_room(
        &mut self,
        session: &mut dyn Forward,
        room: usize,
    ) -> Result<bool, GenerateError> {
        let n_ctx = session.n_ctx();
        if self.held.len() + room <= n_ctx {
            return Ok(false);
        }
        let kept = self.fit(&self.held, n_ctx, room);
        let common = common_prefix(&kept, &self.held);
        session.truncate(common);
        self.held.truncate(common);
        if common < kept.len() {
            session.prefill(&kept[common..], PREFILL_CHUNK)?;
        }
        self.held = kept;
        self.shifts += 1;
        Ok(true)
    }

    /// Where `prompt`, to follow what the session holds, starts after a shift that leaves room
    /// for it and one generated token: the prompt to feed (the end of the kept tokens), with the
    /// session truncated to what it keeps of its own tokens.
    pub fn fit_prompt(&mut self, session: &mut dyn Forward, prompt: &[u32]) -> Vec<u32> {
        let n_ctx = session.n_ctx();
        if self.held.len() + prompt.len() < n_ctx {
            return prompt.to_vec();
        }
        let all: Vec<u32> = self.held.iter().chain(prompt).copied().collect();
        let kept = self.fit(&all, n_ctx, 1);
        // at least the prompt's last token is fed, even where the kept tokens happen to spell
        // the start of what is held
        let common = common_prefix(&kept, &self.held).min(kept.len() - 1);
        session.truncate(common);
        self.held.truncate(common);
        self.shifts += 1;
        kept[common..].to_vec()
    }
}

/// How many leading tokens `a` and `b` share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fit_keeps_the_first_tokens_and_drops_the_oldest_half_of_the_rest() {
        let s = ContextShift::new(2);
        let t: Vec<u32> = (0..10).collect();
        // 10 tokens, 1 free position wanted in 10: drop (10 - 2) / 2 = 4 after the first 2
        assert_eq!(s.fit(&t, 10, 1), [0, 1, 6, 7, 8, 9]);
        // already fits
        assert_eq!(s.fit(&t, 11, 1), t);
        // twice: 10 -> 6 -> 4 (drops 2 of the 4 after the kept)
        assert_eq!(s.fit(&t, 5, 1), [0, 1, 8, 9]);
        // a keep larger than half of what may be held is capped there
        assert_eq!(ContextShift::new(9).fit(&t, 9, 1), [0, 1, 2, 3, 7, 8, 9]);
        // nothing kept, one token at a time at the least
        assert_eq!(ContextShift::new(0).fit(&t, 2, 1), [9]);
    }
}
