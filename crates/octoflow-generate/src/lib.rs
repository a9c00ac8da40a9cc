//! Generation, written once for every front end (`octoflow run`, the server, what comes next).
//!
//! - [`choice`]: [`Limits`] and [`Choice`], the state of one choice that takes each sampled
//!   token and returns the text to release and whether (and why) the choice ends: streaming
//!   decode, stop strings, end-of-generation, the token limit, a full context.
//! - [`constraint`]: grammars (JSON schema, Lark, regex) as a token mask per position, through
//!   llguidance.
//! - [`prompt`]: the checks of a prompt against the context, and prefill chunking.
//! - [`shift`]: context shift, a full session keeping its first tokens and the newer half of
//!   the rest instead of ending.
//! - [`generate`](mod@generate): the loop over one [`octoflow_model::Forward`] session, on the
//!   device's multi-step chains where it samples, else token by token on the CPU.
//!
//! The server's scheduler batches many choices over a `BatchForward` and keeps what is its own
//! (events, metrics, log-probabilities), but ends each choice through a [`Choice`].

pub mod choice;
pub mod constraint;
pub mod error;
pub mod generate;
pub mod prompt;
pub mod shift;

pub use choice::{device_eog, Choice, Limits, Release};
pub use constraint::{Constraint, ConstraintError, Grammar, GrammarEnv};
pub use error::{GenerateError, PromptError};
pub use generate::{generate, Stats};
pub use octoflow_core::Finish;
pub use prompt::{check_prompt, PREFILL_CHUNK};
pub use shift::ContextShift;
