//! The agent VM: many instances of one model, each driven by a small program, run in
//! lock-step batched steps over a [`octoflow_model::BatchForward`] (docs/VM.md is the
//! contract).
//!
//! - [`isa`]: opcodes, operands and the four-word encoding the GPU interpreter reads.
//! - [`asm`](mod@asm): program text to a [`Program`] (constants and stop strings tokenized by
//!   the caller's closure, so this crate needs no tokenizer).
//! - [`pattern`]: the shipped programs (`queue`, `best-of`, `debate`, `swarm`).
//! - [`Run`]: the host interpreter — the reference the GPU interpreter is held to, and the CPU
//!   path: interpret every instance until it yields, plan the rows ([`plan`]), run them as one
//!   forward pass, hand back each instance's results; outputs and runtime errors come back as
//!   [`Event`]s.
//! - [`gpu_state`]: a run's state as the GPU interpreter's words and back
//!   (`octoflow_kernels::agents` runs the three phases of a step on them).
//!
//! ```no_run
//! # fn demo(engine: &mut dyn octoflow_model::BatchForward) -> Result<(), Box<dyn std::error::Error>> {
//! use octoflow_agents::{assemble, Event, Pattern, Run, RunConfig};
//! let tokenize = |s: &str| s.bytes().map(u32::from).collect::<Vec<u32>>();
//! let program = assemble(Pattern::Queue.source(), &tokenize)?;
//! let config = RunConfig { instances: 4, max_tokens: 64, ..RunConfig::default() };
//! let mut run = Run::new(program, config, vec![tokenize("2+2=")], engine)?;
//! while !run.finished() {
//!     run.step(engine)?;
//!     for event in run.events() {
//!         if let Event::Output { task, tokens, .. } = event {
//!             println!("task {task:?}: {tokens:?}");
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```

pub mod asm;
pub mod error;
pub mod event;
pub mod gpu_run;
pub mod gpu_state;
pub mod interp;
pub mod isa;
pub mod memory;
pub mod pattern;
pub mod plan;
pub mod program;
pub mod run;
pub mod sample;
pub mod state;

pub use asm::{assemble, Tokenize};
pub use error::{AgentError, AsmError, AsmErrorKind, DecodeError, Fault, StartError};
pub use event::Event;
pub use gpu_run::{GpuRun, SubmitReport};
pub use isa::{decode_words, Instr, Op, Operand, Special};
pub use pattern::Pattern;
pub use program::Program;
pub use run::{Run, RunConfig, StepReport};
pub use state::{Status, Waiting};
