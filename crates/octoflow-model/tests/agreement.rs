//! Agreement of the CPU reference with llama.cpp on the three golden models (bounds and their
//! reasons: `common/mod.rs`).

mod common;

use common::*;
use octoflow_model::Forward;

fn prompts(name: &str) {
    let (model, golden) = load(name);
    check_prompts(name, &golden, &mut |n| {
        Box::new(model.session(n)) as Box<dyn Forward>
    });
}

fn nll(name: &str) {
    let (model, golden) = load(name);
    check_nll(name, &golden, &mut |n| {
        Box::new(model.session(n)) as Box<dyn Forward>
    });
}

#[test]
fn smollm2_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    prompts(SMOLLM2);
}

#[test]
fn smollm2_mean_nll_agrees_with_llama_cpp() {
    nll(SMOLLM2);
}

#[test]
fn qwen25_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    prompts(QWEN25);
}

#[test]
fn qwen25_mean_nll_agrees_with_llama_cpp() {
    nll(QWEN25);
}

#[test]
fn gemma3_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    prompts(GEMMA3);
}

#[test]
fn gemma3_mean_nll_agrees_with_llama_cpp() {
    nll(GEMMA3);
}
