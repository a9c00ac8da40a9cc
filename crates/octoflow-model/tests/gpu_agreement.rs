//! Agreement of the Vulkan path with llama.cpp on the three golden models, under the same
//! bounds as the CPU reference (`common/mod.rs`). Runs on lavapipe in CI and on real GPUs.

mod common;

use common::*;
use octoflow_model::gpu::GpuModel;
use octoflow_model::Forward;
use octoflow_vk::testing::gpu_or_skip;
use octoflow_vk::Context;

/// Runs `check` on the model's Vulkan sessions, with the device it runs on.
fn with_gpu(name: &str, check: impl FnOnce(&Golden, &mut Open<'_>, &Context)) {
    let Some(ctx) = gpu_or_skip(name) else {
        return;
    };
    let (model, golden) = load(name);
    let gpu = GpuModel::load(&ctx, &model).unwrap();
    check(
        &golden,
        &mut |n| Box::new(gpu.session(n, 4).unwrap()) as Box<dyn Forward>,
        &ctx,
    );
}

/// `check_prompts`, the decode path against batches under the GPU's own bound (f16 operands
/// where batches run on cooperative matrices, plus the f32 single-token path's).
fn prompts_on_gpu(name: &str) {
    with_gpu(name, |golden, open, ctx| {
        let rel = |n: usize| gpu_logit_bound(ctx, n) + gpu_logit_bound(ctx, 1);
        check_prompts_within(name, golden, open, &rel);
    });
}

/// `check_nll` on the GPU.
fn nll_on_gpu(name: &str) {
    with_gpu(name, |golden, open, _| check_nll(name, golden, open));
}

#[test]
fn gpu_smollm2_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    prompts_on_gpu(SMOLLM2);
}

#[test]
fn gpu_smollm2_mean_nll_agrees_with_llama_cpp() {
    nll_on_gpu(SMOLLM2);
}

#[test]
fn gpu_qwen25_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    prompts_on_gpu(QWEN25);
}

#[test]
fn gpu_qwen25_mean_nll_agrees_with_llama_cpp() {
    nll_on_gpu(QWEN25);
}

#[test]
fn gpu_gemma3_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    prompts_on_gpu(GEMMA3);
}

#[test]
fn gpu_gemma3_mean_nll_agrees_with_llama_cpp() {
    nll_on_gpu(GEMMA3);
}
