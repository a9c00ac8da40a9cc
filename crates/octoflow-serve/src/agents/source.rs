//! Which program an agent run runs: a shipped pattern by name or assembly text (docs/VM.md),
//! assembled with constants and stop strings tokenized as `octoflow agents` and the server
//! both do (no BOS, special tokens parsed, so `"<|im_end|>"` is one token).

use octoflow_agents::{assemble, AsmError, Pattern, Program};
use octoflow_text::Tokenizer;

pub use octoflow_agents::pattern::UnknownPattern;

/// An agent program's text and what to call it in messages.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A shipped pattern.
    Pattern(Pattern),
    /// Assembly text from `name` (a file, a request).
    Text { name: String, text: String },
}

impl Source {
    /// A shipped pattern by name (`queue`, `best-of`, `debate`, `swarm`).
    pub fn pattern(name: &str) -> Result<Self, UnknownPattern> {
        name.parse().map(Source::Pattern)
    }

    /// `pattern NAME` or the text's name, for messages.
    pub fn name(&self) -> String {
        match self {
            Source::Pattern(p) => format!("pattern {p}"),
            Source::Text { name, .. } => name.clone(),
        }
    }

    /// The program text.
    pub fn text(&self) -> &str {
        match self {
            Source::Pattern(p) => p.source(),
            Source::Text { text, .. } => text,
        }
    }

    /// Assembles the program; the error names the line.
    pub fn assemble(&self, tokenizer: &Tokenizer) -> Result<Program, AsmError> {
        let tokenize = |s: &str| tokenizer.encode(s, false, true);
        assemble(self.text(), &tokenize)
    }
}
