//! Architectures (llama, qwen2, gemma3), weights, KV cache and the CPU reference forward pass.
//!
//! The CPU reference is the oracle every GPU kernel is tested against: plain f32 math over
//! weights dequantized on the fly, threaded with rayon.
//!
//! ```no_run
//! use octoflow_model::{Forward, Model, Logits};
//! let model = Model::open("smollm2-135m-instruct-q4_1.gguf")?;
//! let mut session = model.session(2048);
//! let logits = session.prefill(&[504, 3575, 282, 4649, 314], 256)?;
//! let next = octoflow_model::ops::argmax(&logits).map(|(id, _)| id as u32);
//! let logits = session.decode(next.unwrap_or(0))?;
//! # let _ = (logits, Logits::Last);
//! # Ok::<(), octoflow_model::ModelError>(())
//! ```

pub mod adapter;
pub mod arch;
pub mod attention;
pub mod backend;
pub mod batch;
pub mod config;
pub mod cpu_batch;
pub mod error;
pub mod forward;
pub mod ggml_matmul;
pub mod gpu;
pub mod kv_cache;
pub mod kv_pool;
pub mod matmul;
pub mod model;
pub mod nll;
pub mod numerics;
pub mod ops;
pub mod plan;
pub mod weights;

/// Test support (tiny random models); also for other crates' tests with feature `testing`.
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use adapter::{Adapter, LoraTensor, Target};
pub use arch::Architecture;
pub use backend::{Forward, Steps};
pub use batch::{BatchForward, BatchRow, KvRoom, RowOutput, RowResult, TokenIn, MAX_IN_FLIGHT};
pub use config::{Activation, ModelConfig, RopeType};
pub use cpu_batch::CpuBatch;
pub use error::{ModelError, Result};
pub use forward::{Logits, Session, Tap};
pub use kv_cache::KvCache;
pub use kv_pool::{KvFull, KvPool};
pub use model::Model;
pub use nll::{mean_nll, mean_nll_with, token_nlls, token_nlls_with};
pub use numerics::Numerics;
pub use plan::{
    AttnKind, AttnPlan, BlockPlan, FfnPlan, Gating, GluPlan, MoeAct, MoePlan, RopePlan, Yarn,
};
pub use weights::{BlockWeights, FfnWeights, GluWeights, ModelWeights, MoeWeights, QMatrix};
