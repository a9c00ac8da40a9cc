//! What a run hands the host: outputs and per-instance errors, in the order they happened.

use octoflow_core::Finish;

/// One thing the host learns from a step ([`crate::Run::events`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An `emit`: the instance's last span.
    Output {
        instance: u32,
        /// The host task the instance's current task descends from (`%parent`); `None` before
        /// its first `take` or `task`.
        task: Option<u32>,
        /// The `emit` operand (a round, a stage: the program's choice).
        round: u32,
        /// The span without its stop match.
        tokens: Vec<u32>,
        /// Why the span ended: `Eog`, `Stop` (a stop-set sequence), `Length`, `Context`.
        finish: Option<Finish>,
        /// Mean log-probability of the span's generated tokens at temperature 1 (`-inf` for an
        /// empty span; from the engine's sampler when it sampled on the device).
        score: f32,
    },
    /// A runtime error that ended `instance` (the others go on).
    Error { instance: u32, message: String },
}
