//! Agreement of the CPU reference with llama.cpp on the three golden models (bounds and their
//! reasons: `common/mod.rs`), in both numerics: exact f32 (the default) and llama.cpp's CPU
//! roundings ([`Numerics::Ggml`]).

mod common;

use common::*;
use octoflow_model::{Forward, Numerics};

fn prompts(name: &str, numerics: Numerics) {
    let (model, golden) = load(name);
    check_prompts(name, &golden, &mut |n| {
        Box::new(model.session_with(n, numerics)) as Box<dyn Forward>
    });
}

fn nll(name: &str, numerics: Numerics) {
    let (model, golden) = load(name);
    check_nll(name, &golden, &mut |n| {
        Box::new(model.session_with(n, numerics)) as Box<dyn Forward>
    });
}

#[test]
fn smollm2_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    prompts(SMOLLM2, Numerics::Exact);
}

#[test]
fn smollm2_mean_nll_agrees_with_llama_cpp() {
    nll(SMOLLM2, Numerics::Exact);
}

#[test]
fn qwen25_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    prompts(QWEN25, Numerics::Exact);
}

#[test]
fn qwen25_mean_nll_agrees_with_llama_cpp() {
    nll(QWEN25, Numerics::Exact);
}

#[test]
fn gemma3_prompts_and_greedy_tokens_agree_with_llama_cpp() {
    prompts(GEMMA3, Numerics::Exact);
}

#[test]
fn gemma3_mean_nll_agrees_with_llama_cpp() {
    nll(GEMMA3, Numerics::Exact);
}

/// Greedy agreement counts of every prompt of the three models with llama.cpp's roundings;
/// each prompt held to the same bounds as the exact path (top-20 logits, near-tie divergences).
fn ggml_greedy_counts() -> (usize, usize) {
    let (mut exact, mut total) = (0, 0);
    for name in [SMOLLM2, QWEN25, GEMMA3] {
        let (model, golden) = load(name);
        let (e, t) = greedy_counts(name, &golden, &mut |n| {
            Box::new(model.session_with(n, Numerics::Ggml)) as Box<dyn Forward>
        });
        exact += e;
        total += t;
    }
    println!("ggml numerics: {exact}/{total} prompts agree on their first 16 greedy tokens");
    (exact, total)
}

/// With llama.cpp's roundings every prompt stays within the exact path's bounds, and at least
/// as many prompts agree on all greedy tokens as with exact f32 math (14 of 19).
///
/// No decode-versus-batch check here: the decode path's integer dots and the batch path's GEMM
/// agree to f32 rounding per product (`ggml_matmul` tests), but an ulp can move an activation
/// across a Q8 rounding boundary, a step of absmax/127, and the logits move by up to ~0.4.
#[test]
fn ggml_numerics_prompts_agree_with_llama_cpp_within_near_ties() {
    let (exact, total) = ggml_greedy_counts();
    assert!(
        exact >= 14 && total == 19,
        "{exact} of {total} prompts agree"
    );
}

/// The demand (identical first 16 greedy tokens for at least 90% of the golden
/// prompts) is NOT met by emulating llama.cpp's roundings: 14 of 19, as with f32 math. The
/// Q8 activation quantization makes llama.cpp's own outputs depend on the float summation
/// order of the CPU it runs on (llama-cpp-python built on an AVX2 machine agrees with the
/// golden files on 15 of 19 prompts), so agreement beyond that needs the golden machine's
/// bit-exact kernels. Kept, ignored, to measure future attempts.
#[test]
#[ignore = "not met: 14 of 19 prompts (see the doc comment)"]
fn ggml_numerics_reproduce_the_greedy_tokens_of_90_percent_of_prompts() {
    let (exact, total) = ggml_greedy_counts();
    assert!(
        10 * exact >= 9 * total,
        "only {exact} of {total} prompts agree on their first 16 greedy tokens"
    );
}

#[test]
fn ggml_numerics_mean_nll_agrees_with_llama_cpp() {
    for name in [SMOLLM2, QWEN25, GEMMA3] {
        nll(name, Numerics::Ggml);
    }
}
