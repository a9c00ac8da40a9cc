//! Prompt reuse across requests: each instance's KV cache still holds the tokens its last
//! sequence ran (an instance owns positions `0..n_ctx` of its cache and a sequence writes
//! position `p` only when it runs the token at `p`), so a new request whose prompt starts with
//! those tokens is placed in that instance and prefills only the rest. A chat's next turn
//! (the conversation so far plus a new message) and requests sharing a system prompt skip what
//! an instance already ran, as llama-server's slot reuse does.
//!
//! What an instance holds is recorded when its sequence ends: the prompt and the generated
//! tokens the host knows, up to the positions that were run (a row still in flight then writes
//! exactly the token recorded for its position, and runs before anything submitted later).
//! Anything else that writes an instance's cache (an agent run, an engine failure) forgets it.
//! Sharing one copy of a prefix between instances needs paged caches, which the engine does not
//! have yet.

/// What one instance's cache holds.
#[derive(Debug, Clone, Default)]
struct Held {
    /// Token at each position `0..tokens.len()`.
    tokens: Vec<u32>,
    /// The LoRA adapter those positions ran with (its keys and values differ from the base's).
    adapter: Option<u32>,
    /// When the instance was last given out or its sequence ended (higher: more recent).
    used: u64,
}

/// The instances' cached prefixes.
#[derive(Debug, Clone)]
pub struct Prefixes {
    held: Vec<Held>,
    clock: u64,
    enabled: bool,
}

impl Prefixes {
    /// `n_slots` instances holding nothing; `enabled` false never reuses anything.
    pub fn new(n_slots: usize, enabled: bool) -> Self {
        Self {
            held: vec![Held::default(); n_slots],
            clock: 0,
            enabled,
        }
    }

    /// Records that `slot` holds `tokens` (run with `adapter`), as of now.
    pub fn keep(&mut self, slot: usize, tokens: Vec<u32>, adapter: Option<u32>) {
        self.clock += 1;
        if let Some(h) = self.held.get_mut(slot) {
            h.tokens = if self.enabled { tokens } else { Vec::new() };
            h.adapter = adapter;
            h.used = self.clock;
        }
    }

    /// Records that `slot`'s cache holds nothing reusable.
    pub fn forget(&mut self, slot: usize) {
        if let Some(h) = self.held.get_mut(slot) {
            h.tokens.clear();
        }
    }

    /// Forgets every instance.
    pub fn forget_all(&mut self) {
        for h in &mut self.held {
            h.tokens.clear();
        }
    }

    /// Positions of `prompt` that `slot` already holds: the common prefix, short of the last
    /// prompt token (which must run to give the first token's logits).
    pub fn reusable(&self, slot: usize, prompt: &[u32], adapter: Option<u32>) -> usize {
        let Some(h) = self.held.get(slot).filter(|h| h.adapter == adapter) else {
            return 0;
        };
        octoflow_generate::shift::common_prefix(&h.tokens, prompt)
            .min(prompt.len().saturating_sub(1))
    }

    /// Gives `n` of the `free` slots to a request with `prompt`: the ones holding the longest
    /// reusable prefix first, then the least recently used (so recent prefixes stay for the
    /// requests that may share them). Returns `(slot, reused positions)`; the slots are marked
    /// used and hold nothing beyond the reused positions from now on.
    pub fn pick(
        &mut self,
        free: &[usize],
        n: usize,
        prompt: &[u32],
        adapter: Option<u32>,
    ) -> Vec<(usize, usize)> {
        let mut order: Vec<(usize, usize)> = free
            .iter()
            .map(|&s| (s, self.reusable(s, prompt, adapter)))
            .collect();
        order.sort_by_key(|&(s, reuse)| {
            let used = self.held.get(s).map_or(0, |h| h.used);
            (std::cmp::Reverse(reuse), used, s)
        });
        order.truncate(n);
        for &(s, reuse) in &order {
            self.clock += 1;
            if let Some(h) = self.held.get_mut(s) {
                h.used = self.clock;
                h.tokens.truncate(reuse);
            }
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_held_prefix_wins_and_the_last_prompt_token_always_runs() {
        let mut p = Prefixes::new(3, true);
        p.keep(0, vec![1, 2, 3, 9], None);
        p.keep(1, vec![1, 2, 3, 4, 5, 6], None);
        p.keep(2, vec![1, 2, 3, 4, 5, 6], Some(0));
        // slot 2 ran with an adapter: nothing of it is reusable for the base
        assert_eq!(p.reusable(2, &[1, 2, 3, 4], None), 0);
        assert_eq!(p.reusable(1, &[1, 2, 3, 4, 5, 6], None), 5);
        let picked = p.pick(&[0, 1, 2], 2, &[1, 2, 3, 4, 5, 7], None);
        assert_eq!(picked, vec![(1, 5), (0, 3)]);
        // the picked slots now hold only what was reused
        assert_eq!(p.reusable(1, &[1, 2, 3, 4, 5, 6, 8], None), 5);
        assert_eq!(p.reusable(0, &[1, 2, 3, 9, 9], None), 3);
    }

    #[test]
    fn without_reuse_the_least_recently_used_slot_is_taken() {
        let mut p = Prefixes::new(3, true);
        let a = p.pick(&[0, 1, 2], 1, &[7, 7], None);
        let b = p.pick(&[0, 1, 2], 1, &[8, 8], None);
        let c = p.pick(&[0, 1, 2], 1, &[9, 9], None);
        assert_eq!((a[0].0, b[0].0, c[0].0), (0, 1, 2));
        p.keep(0, vec![5, 6, 7], None);
        // slot 0 just ended holding a prefix others may want: a stranger takes slot 1, the
        // least recently used
        assert_eq!(p.pick(&[0, 1, 2], 1, &[1, 1], None), vec![(1, 0)]);
        p.forget(0);
        assert_eq!(p.reusable(0, &[5, 6, 7, 8], None), 0);
    }

    #[test]
    fn disabled_reuse_holds_nothing() {
        let mut p = Prefixes::new(1, false);
        p.keep(0, vec![1, 2, 3], None);
        assert_eq!(p.reusable(0, &[1, 2, 3, 4], None), 0);
    }
}
