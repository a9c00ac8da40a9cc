//! Per-token ops on the residual stream and FFN activations: RMSNorm (with its fused residual
//! add), the element-wise add, and the gated linear unit. Shaders: `shaders/elementwise/`.

pub mod add;
pub mod glu;
pub mod rms_norm;
