//! The end of a decode step on the device: the greedy pick (argmax), the sampler, the next
//! step's input ids, the positions' advance and the stop gate, so that a step's token never
//! has to visit the host. Shaders: `shaders/sampling/`.

pub mod advance;
pub mod argmax;
pub mod gate;
pub mod pick_ids;
pub mod sample;
