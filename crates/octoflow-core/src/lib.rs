//! The ground floor: plain data that several layers share and that depends on nothing of ours.
//!
//! - [`sampling`]: sampling parameters and the CPU sampler — the specification every device
//!   sampler reproduces.
//! - [`draw`]: [`Draw`], one token draw as a device sampler takes it.
//! - [`finish`]: [`Finish`], why a generation ended.
//! - [`mask`]: [`TokenMask`], the tokens a constrained draw may take.
//!
//! Kernels, model, text, generation and serving all read these, so none of them has to import
//! another's crate (or a tokenizer) to agree on what a draw or a finish is.

pub mod draw;
pub mod finish;
pub mod mask;
pub mod sampling;

pub use draw::Draw;
pub use finish::Finish;
pub use mask::TokenMask;
pub use sampling::{random_seed, Sampler, SamplingParams};
