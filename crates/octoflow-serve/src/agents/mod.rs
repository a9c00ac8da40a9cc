//! Agent runs (docs/VM.md) over HTTP, and the pieces `octoflow agents` shares with them.
//!
//! Shared with the CLI, so that a task file and a request body read alike and output lines
//! look alike: [`tasks`] (a task's JSON to its tokens), [`source`] (a pattern or assembly text
//! to a program), [`lines`] (events to output lines).
//!
//! The server's side: [`request`] (the body and its checks), [`job`] (what goes to the
//! scheduler and back), [`active`] (an admitted run, stepped in the scheduler's shared steps),
//! [`stream`] (the SSE answer), [`route`] (the handler).

pub mod active;
pub mod job;
pub mod lines;
pub mod request;
pub mod route;
pub mod source;
pub mod stream;
pub mod tasks;
