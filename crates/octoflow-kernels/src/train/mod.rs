//! Training (QLoRA): gradients through frozen weights (`linear_t`), the strided f32 GEMM of
//! the adapters and the materialized attention, the backward kernels, the loss, the optimizer
//! step, the gradient norm and dropout. Shaders: `shaders/train/`.

pub mod adamw;
pub mod cross_entropy;
pub mod dropout;
pub mod gemm;
pub mod glu_back;
#[cfg(test)]
pub(crate) mod grad_check;
pub mod linear_t;
pub mod masked_softmax;
pub mod rms_norm_back;
pub mod sum_squares;
