//! GLSL compute shaders and their CPU references, one module per op.
//!
//! # The pattern every kernel follows
//!
//! An op named `foo` of family `fam` has three parts sharing its name:
//!
//! 1. **`shaders/fam/foo.comp`** — the GLSL compute shader. Headers several families share
//!    live in `shaders/*.glsl`, a family's own in `shaders/fam/` (`#include "common.glsl"`
//!    after the `local_size` layout; the source's folder is searched first). Variants (quant
//!    type, tile, fusions) are preprocessor defines listed in `shaders/variants.txt`
//!    (`<output> fam/foo.comp NAME=VALUE ...`); a `.comp` not listed there is built once as
//!    `foo`. `build.rs` compiles everything to SPIR-V with glslang at build time (see the
//!    `octoflow-glsl` crate) and [`shaders`] embeds it: `shaders::FOO` is an
//!    [`octoflow_vk::Shader`]. It also generates the per-weight-type lookup of the quantized
//!    ops from the same table. Variants tagged `@bench` (ablations, probes) are built only with
//!    the `bench` feature and never embedded in the product.
//! 2. **`src/fam/foo.rs`** — a struct holding the op's [`octoflow_vk::Pipeline`], built once (model
//!    load) by `Foo::new(&Context)`, which picks the variant from [`octoflow_vk::DeviceCaps`];
//!    a `record(&self, &mut Chain, ...)` method (the chain knows its device) that checks shapes and records the dispatch
//!    (barriers are the caller's: it knows the data dependencies); and `foo_ref`, the CPU
//!    reference, written plainly as the specification of what the shader computes. Shapes,
//!    layouts and units are stated once in the doc comment.
//! 3. **A test in `src/fam/foo.rs`** (or `foo_tests.rs` beside it) that runs the shader on a
//!    device (lavapipe in CI) on fresh random inputs (the seed is printed on failure), with the
//!    output poisoned with NaN before the run, and compares with `foo_ref` under a relative
//!    error bound stated in the test ([`check_close`]: NaN never passes), using the shared kit
//!    of `src/testkit.rs`. GPU tests fail without a device unless `OCTOFLOW_SKIP_GPU_TESTS=1`.
//!
//! # Families
//!
//! Ops are grouped by what they serve, one folder each in `src/` and in `shaders/`:
//! `linear/` (products on GGUF weights: matvec work layouts, the cooperative-matrix matmul and
//! its split-K sum, the fused gate/up/activation, row lookups, LoRA products), `attention/`
//! (the attention kernels and what prepares their operands: RoPE, the KV-cache write, softmax),
//! `elementwise/` (RMSNorm, add, GLU: per-token ops on the residual stream), `moe/` (the
//! mixture-of-experts feed-forward: routing, grouping by expert, expert products, the weighted
//! sum), `sampling/` (the
//! end of a decode step: argmax, sampler, next ids, positions, stop gate) and `train/`
//! (backward kernels, loss, optimizer, GEMM). The cut follows the callers — a model's forward
//! step uses the first four, the trainer adds the fifth — and the shared shader headers: each
//! family's shaders include the family's own headers plus `common`, `quant`, `reduce` and
//! `glu`. The crate root re-exports every op module (`octoflow_kernels::rope`) and type, so
//! dependents name ops, not folders. What every family uses sits at the root: errors, operand
//! checks, per-queue scratch, specialized pipelines and the [`Tuning`] read once per device.

mod check;
mod error;
mod operand;
mod scratch;
mod spec;
#[cfg(test)]
mod testkit;
mod tuning;

pub mod agents;
pub mod attention;
pub mod elementwise;
pub mod linear;
pub mod moe;
pub mod sampling;
pub mod train;

// Every op module at the root, as dependents and the ops themselves name them.
pub use attention::kv_type;
pub use attention::page::{blocks_for, page_row, KV_PAGE};
pub(crate) use attention::{attention_coop, attention_decode};
pub use attention::{page, rope, rope_store, set_rows, soft_max};
pub use elementwise::{add, glu, rms_norm};
pub(crate) use linear::qweight;
pub use linear::{get_rows, lora, matmul_coop, split_sum};
pub use sampling::{advance, argmax, gate, pick_ids, sample};
#[cfg(test)]
pub(crate) use train::grad_check;
pub use train::{
    adamw, cross_entropy, dropout, gemm, glu_back, linear_t, masked_softmax, rms_norm_back,
    sum_squares,
};

pub use adamw::{adamw_ref, AdamW, AdamWStep};
pub use argmax::{argmax_ref, Argmax};
pub use attention::{attention_ref, Attention, AttentionArgs, AttentionShape};
pub use attention_coop::attention_coop_ref;
pub use attention_decode::{fresh_applies, FreshKv, DECODE_MAX_TOKENS};
pub use check::{check_close, check_close_sum};
pub use cross_entropy::{cross_entropy_ref, CrossEntropy, CrossEntropyArgs, IGNORE};
pub use dropout::{dropout_ref, dropout_uniform, Dropout};
pub use error::{KernelError, Result};
pub use gemm::{gemm_ref, Gemm, GemmArgs, Strides};
pub use get_rows::{GetRows, GetRowsArgs};
pub use glu::{glu_ref, Glu, GluOp};
pub use glu_back::{glu_back_ref, GluBack};
pub use kv_type::{KvType, UnknownKvType};
pub use linear::{
    q8_words, Linear, LinearArgs, LinearGluArgs, PendingNorm, QWeightRef, StepLinear,
};
pub use linear_t::{linear_t_ref, LinearT, LinearTArgs};
pub use lora::{lora_ref, Lora, LoraMix, LoraStack};
pub use masked_softmax::{masked_softmax_back_ref, masked_softmax_ref, MaskedSoftmax, SoftmaxMask};
pub use matmul_coop::{matmul_coop_ref, MatmulCoop};
pub use moe::{
    moe_combine_ref, moe_experts_dot_ref, moe_experts_ref, moe_group_ref, moe_route_ref, Combine,
    ExpertWeights, ExpertsArgs, Groups, Moe, MoeAct, MoeCombine, MoeExperts, MoeGating, MoeGroup,
    MoeRoute,
};
pub use operand::Positions;
pub use pick_ids::{pick_ids_ref, PickIds, FROM_PREV};
pub use rms_norm::{rms_norm_ref, RmsNorm};
pub use rms_norm_back::{rms_norm_back_ref, RmsNormBack};
pub use rope::{rope_back_ref, rope_ref, Rope, RopeArgs, RopeFreqs, RopeMode};
pub use rope_store::{rope_store_ref, RopeStore, RopeStoreArgs, RopeStoreShape};
pub use sample::{
    mask_row_words, sample_masked_ref, sample_ref, uniform_ref, Sample, SamplerState, MAX_TOP_K,
};
pub use set_rows::{set_rows_ref, SetRows};
pub use soft_max::{soft_max_ref, SoftMax};
pub use split_sum::{split_sum_ref, SplitSum, SumTarget};
pub use sum_squares::{sum_squares_ref, SumSquares};
pub use tuning::{DotBatches, Tuning, DOT_MIN_WEIGHTS, FALLBACK_COMPUTE_UNITS};

// Benchmarks: unit tests of the crate (they time crate-private layouts and ablation variants),
// kept out of src/ and built only with the `bench` feature; see the file's header.
#[cfg(all(test, feature = "bench"))]
#[path = "../benches/linear_bench.rs"]
mod linear_bench;

/// Every embedded shader variant, generated by build.rs from `shaders/`.
pub mod shaders {
    include!(concat!(env!("OUT_DIR"), "/shaders.rs"));
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use octoflow_vk::{Pipeline, PipelineDesc};

    #[test]
    fn every_embedded_shader_is_valid_spirv() {
        assert!(!super::shaders::ALL.is_empty());
        for s in super::shaders::ALL {
            let words = s.words().unwrap_or_else(|e| panic!("{}: {e}", s.name));
            assert!(words.len() > 5, "{}", s.name);
        }
    }

    #[test]
    fn every_embedded_shader_builds_a_pipeline_on_the_device() {
        let Some(ctx) = gpu_or_skip("every_embedded_shader_builds_a_pipeline") else {
            return;
        };
        let coop = crate::MatmulCoop::supported(ctx.caps());
        for s in super::shaders::ALL {
            // matmul_coop_*, attention_coop_*, coopmat_probe_*
            if s.name.contains("coop") && !coop {
                // Cooperative-matrix SPIR-V needs the extension (absent on lavapipe).
                println!("{}: skipped, no cooperative matrices", s.name);
                continue;
            }
            // f16 KV cache variants (`*_kv16`) need 16-bit storage buffers
            if s.name.contains("kv16") && !crate::KvType::F16.supported(ctx.caps()) {
                println!("{}: skipped, no 16-bit storage buffers", s.name);
                continue;
            }
            // Binding counts only matter for dispatch; the layout may declare more than used.
            Pipeline::new(&ctx, &PipelineDesc::new(*s, 8, 64))
                .unwrap_or_else(|e| panic!("{}: {e}", s.name));
        }
    }
}
