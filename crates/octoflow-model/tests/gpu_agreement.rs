//! Agreement of the Vulkan path with llama.cpp on the three golden models, under the same
//! bounds as the CPU reference (`common/mod.rs`). Runs on lavapipe in CI and on real GPUs.

mod common;

use common::*;
use octoflow_model::gpu::{GpuModel, KvType};
use octoflow_model::{mean_nll_with, Forward};
use octoflow_vk::testing::{gpu_or_skip, gpu_with_integer_dot_or_skip};
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

/// One-token Q4_K and Q6_K products on 8-bit dot products of a quantized x (the default where
/// a GPU accelerates them; forced here wherever the driver has integer dot products):
/// qwen2.5's Q4_K and Q6_K down projections take them in every decode step, and the model
/// still agrees with llama.cpp as the f32 products do.
#[test]
fn gpu_decode_on_8bit_dot_products_agrees_with_llama_cpp() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("matvec_dot_models") else {
        return;
    };
    let name = QWEN25;
    let (model, golden) = load(name);
    let tuning = octoflow_kernels::Tuning {
        matvec_dot: true,
        ..octoflow_kernels::Tuning::from_caps(ctx.caps())
    };
    let linear = octoflow_kernels::Linear::with_tuning(&ctx, tuning).unwrap();
    let gpu = GpuModel::load(&ctx, &model).unwrap().with_linear(linear);
    // decode against the f32 batch: the 8-bit codes of x move a logit by a fraction of a
    // percent of the largest, as f16 operands move the batches' on cooperative matrices
    let rel = |n: usize| gpu_logit_bound(&ctx, n).max(1e-2) + gpu_logit_bound(&ctx, 1);
    check_prompts_within(
        name,
        &golden,
        &mut |n| Box::new(gpu.session(n, 4).unwrap()) as Box<dyn Forward>,
        &rel,
    );
    // the path was taken: a decode step's logits are not the f32 products'
    let case = &golden.greedy[0];
    let step = |m: &GpuModel| {
        let mut s = m.session(case.prompt_ids.len() + 1, 4).unwrap();
        s.prefill(&case.prompt_ids, 256).unwrap();
        s.decode(case.greedy_ids[0]).unwrap()
    };
    let f32_products = octoflow_kernels::Tuning {
        matvec_dot: false,
        ..tuning
    };
    let plain = GpuModel::load(&ctx, &model)
        .unwrap()
        .with_linear(octoflow_kernels::Linear::with_tuning(&ctx, f32_products).unwrap());
    assert_ne!(
        step(&gpu),
        step(&plain),
        "the 8-bit products were not taken"
    );
}

/// f16 KV caches (the binary's default; llama.cpp's too) move the mean NLL by less than 0.5% of
/// the f32 caches' own, q8_0 caches (llama.cpp's blocks of 32) too (over the first
/// 256 golden tokens: two runs of the whole text would make this the slowest test on lavapipe;
/// 0.004% measured for f16 over all 512; 0.004% and 0.006% for f16 and q8_0 over these 256).
#[test]
fn gpu_smollm2_f16_and_q8_0_kv_caches_keep_the_mean_nll_near_f32() {
    let Some(ctx) = gpu_or_skip("gpu_f16_kv_nll") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let mut gpu = GpuModel::load(&ctx, &model).unwrap();
    let ids = &golden.nll[0].token_ids[..256];
    let nll = |gpu: &GpuModel| mean_nll_with(&mut gpu.session(ids.len(), 4).unwrap(), ids);
    let f32_nll = nll(&gpu).unwrap();
    for (kv, bound) in [(KvType::F16, 0.005), (KvType::Q8_0, 0.005)] {
        if !kv.supported(ctx.caps()) {
            println!("{kv}: skipped, {} cannot hold such caches", ctx.caps().name);
            continue;
        }
        gpu.set_kv_type(kv).unwrap();
        let kv_nll = nll(&gpu).unwrap();
        let rel = (kv_nll - f32_nll).abs() / f32_nll;
        println!(
            "mean NLL: f32 KV {f32_nll:.5}, {kv} KV {kv_nll:.5}, relative {:.4}%",
            100.0 * rel
        );
        assert!(
            kv_nll.is_finite() && rel <= bound,
            "{kv}: {kv_nll} vs {f32_nll}"
        );
    }
}
