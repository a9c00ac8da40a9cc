//! The GPU forward of every architecture against the CPU reference on fresh tiny random models
//! (lavapipe in CI): a prompt's logits at every position, then decode steps. The CPU reference
//! itself is held to llama.cpp per architecture in crates/octoflow/tests/llama_cpp_arch.rs, so
//! together they tie each family's GPU path to llama.cpp.

use crate::gpu::GpuModel;
use crate::testing::{rel_err, rng, tiny_model, TINY};
use crate::{Forward, Logits};
use octoflow_vk::testing::gpu_or_skip;
use rand::Rng;

#[test]
fn every_architecture_runs_on_the_gpu_as_on_the_cpu_reference() {
    let Some(ctx) = gpu_or_skip("every_architecture_runs_on_the_gpu") else {
        return;
    };
    for arch in ["llama", "qwen2", "qwen3", "gemma3", "phi3"] {
        let mut r = rng(&format!("gpu_arch_{arch}"));
        let model = tiny_model(arch, TINY, &mut r);
        let gm = GpuModel::load(&ctx, &model).expect("gpu model");
        // f32 on both sides, different summation orders: 1e-4; batches on cooperative
        // matrices (f16-rounded operands) 5e-3
        let bound = if gm.kernels().linear.uses_coop(16) {
            5e-3
        } else {
            1e-4
        };
        let tokens: Vec<u32> = (0..10)
            .map(|_| r.gen_range(0..TINY.n_vocab as u32))
            .collect();
        let want = model
            .session(32)
            .forward(&tokens, 0, Logits::All)
            .expect("cpu forward");
        let mut s = gm.session(32, 4).expect("gpu session");
        let got = s.forward(&tokens, 0, Logits::All).expect("gpu forward");
        let err = rel_err(&got, &want);
        assert!(err <= bound, "{arch}: prompt logits off by {err}");
        // decode: one token at a time after the prompt
        let mut cpu = model.session(32);
        cpu.forward(&tokens, 0, Logits::None).expect("cpu prefill");
        for (i, &t) in [3u32, 7, 11].iter().enumerate() {
            let pos = tokens.len() + i;
            let want = cpu.forward(&[t], pos, Logits::Last).expect("cpu step");
            let got = s.forward(&[t], pos, Logits::Last).expect("gpu step");
            let err = rel_err(&got, &want);
            assert!(err <= bound, "{arch}: decode step {i} off by {err}");
        }
    }
}

#[test]
fn gpt_oss_on_the_gpu_is_a_clear_error_pointing_to_the_cpu_reference() {
    let Some(ctx) = gpu_or_skip("gpt_oss_on_the_gpu_is_a_clear_error") else {
        return;
    };
    let model = tiny_model("gpt-oss", TINY, &mut rng("gpu_arch_gpt_oss"));
    let e = GpuModel::load(&ctx, &model)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("gpt-oss") && e.contains("mixture-of-experts") && e.contains("--device cpu"),
        "{e}"
    );
}
