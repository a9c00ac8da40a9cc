//! One choice being generated: each sampled token goes in, the text that is final and whether
//! (and why) the choice ends come out.

use octoflow_core::Finish;
use octoflow_text::stop::StopMatcher;
use octoflow_text::stream::StreamDecoder;
use octoflow_text::Tokenizer;

/// When a choice ends, besides a full context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// At most this many generated tokens (`None`: until end of generation or a full context).
    pub max_tokens: Option<usize>,
    /// Stop strings (the text ends before the first one found; it is not released).
    pub stops: Vec<String>,
    /// Keep generating after end-of-generation tokens.
    pub ignore_eos: bool,
}

/// What one token (or the end) releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// Text that is final (UTF-8 complete, no part of a stop string).
    pub text: String,
    /// Set when the choice ends here.
    pub finish: Option<Finish>,
}

/// The state of one choice: streaming decoder, stop matcher, counts.
pub struct Choice<'t> {
    tokenizer: &'t Tokenizer,
    decoder: StreamDecoder<'t>,
    stop: StopMatcher,
    max_tokens: Option<usize>,
    ignore_eos: bool,
    generated: usize,
    /// Position the next generated token will be fed at.
    next_pos: usize,
    n_ctx: usize,
}

impl<'t> Choice<'t> {
    /// A choice whose first generated token will be fed at position `start` of a context of
    /// `n_ctx` positions.
    pub fn new(tokenizer: &'t Tokenizer, limits: &Limits, start: usize, n_ctx: usize) -> Self {
        Self {
            tokenizer,
            decoder: tokenizer.stream_decoder(),
            stop: StopMatcher::new(limits.stops.iter().cloned()),
            max_tokens: limits.max_tokens,
            ignore_eos: limits.ignore_eos,
            generated: 0,
            next_pos: start,
            n_ctx,
        }
    }

    /// Tokens taken so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Takes one sampled token. The context is full, as the device's `advance` decides, when
    /// no position after this token's is left for the one it would bring.
    pub fn push(&mut self, token: u32) -> Release {
        self.generated += 1;
        let pos = self.next_pos;
        self.next_pos += 1;
        if !self.ignore_eos && self.tokenizer.is_eog(token) {
            return self.end(Finish::Eog);
        }
        let step = self.stop.push(&self.decoder.push(token));
        if step.stopped {
            return Release {
                text: step.emit,
                finish: Some(Finish::Stop),
            };
        }
        let finish = if self.max_tokens.is_some_and(|n| self.generated >= n) {
            Some(Finish::Length)
        } else {
            (pos + 1 >= self.n_ctx).then_some(Finish::Context)
        };
        match finish {
            None => Release {
                text: step.emit,
                finish: None,
            },
            Some(f) => {
                let mut end = self.end(f);
                end.text.insert_str(0, &step.emit);
                end
            }
        }
    }

    /// Ends the choice for `finish` (decided here or by the device) and releases what the
    /// decoder and the stop matcher still hold; a stop string found in it makes the finish
    /// [`Finish::Stop`].
    pub fn end(&mut self, finish: Finish) -> Release {
        let rest = self.stop.push(&self.decoder.finish());
        if rest.stopped {
            return Release {
                text: rest.emit,
                finish: Some(Finish::Stop),
            };
        }
        Release {
            text: rest.emit + &self.stop.finish(),
            finish: Some(finish),
        }
    }
}

/// End-of-generation ids for a device to stop on, the primary ones first (it checks a few);
/// none with `ignore_eos`.
pub fn device_eog(tokenizer: &Tokenizer, ignore_eos: bool) -> Vec<u32> {
    if ignore_eos {
        return Vec::new();
    }
    let sp = tokenizer.special();
    let mut ids: Vec<u32> = [sp.eos, sp.eot, sp.eom].into_iter().flatten().collect();
    for &id in &sp.eog {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids.retain(|&id| tokenizer.is_eog(id));
    ids
}

#[cfg(test)]
#[path = "choice_tests.rs"]
mod tests;
