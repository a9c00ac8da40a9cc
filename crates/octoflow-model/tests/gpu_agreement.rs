//! Agreement of the Vulkan path with llama.cpp on the three golden models, under the same
//! bounds as the CPU reference (`common/mod.rs`). Runs on lavapipe in CI and on real GPUs.

mod common;

use common::*;
use octoflow_model::gpu::GpuModel;
use octoflow_model::Forward;
use octoflow_vk::testing::gpu_or_skip;

fn with_gpu(name: &str, check: fn(&str, &Golden, &mut Open<'_>)) {
    let Some(ctx) = gpu_or_skip(name) else {
        return;
    };
    let (model, golden) = load(name);
    let gpu = GpuModel::load(&ctx, &model).unwrap();
    check(name, &golden, &mut |n| {
        Box::new(gpu.session(n, 4).unwrap()) as Box<dyn Forward>
    });
}

#[test]
fn gpu_smollm2_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    with_gpu(SMOLLM2, check_prompts);
}

#[test]
fn gpu_smollm2_mean_nll_agrees_with_llama_cpp() {
    with_gpu(SMOLLM2, check_nll);
}

#[test]
fn gpu_qwen25_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    with_gpu(QWEN25, check_prompts);
}

#[test]
fn gpu_qwen25_mean_nll_agrees_with_llama_cpp() {
    with_gpu(QWEN25, check_nll);
}

#[test]
fn gpu_gemma3_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    with_gpu(GEMMA3, check_prompts);
}

#[test]
fn gpu_gemma3_mean_nll_agrees_with_llama_cpp() {
    with_gpu(GEMMA3, check_nll);
}
