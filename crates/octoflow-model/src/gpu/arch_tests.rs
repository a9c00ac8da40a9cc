//! The GPU forward of every architecture against the CPU reference on fresh tiny random models
//! (lavapipe in CI): a prompt's logits at every position, then decode steps. The CPU reference
//! itself is held to llama.cpp per architecture in crates/octoflow/tests/llama_cpp_arch.rs, so
//! together they tie each family's GPU path to llama.cpp.

use crate::gpu::GpuModel;
use crate::plan::{AttnKind, Yarn};
use crate::testing::{random_vec, rel_err, rng, tiny_model, TINY};
use crate::{BatchForward, BatchRow, Forward, Logits, Model, RowOutput, RowResult, TokenIn};
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

/// A tiny llama whose attention is gpt-oss's (its feed-forward stays a GLU until the GPU runs a
/// mixture of experts): learned sink logits, an output bias, NeoX RoPE with YaRN over an
/// original context of 64 (its ramp inside the tiny head's pairs) and a window of 4 on even
/// layers.
fn gpt_oss_attention_model(r: &mut rand::rngs::StdRng) -> Model {
    let mut model = tiny_model("llama", TINY, r);
    let c = &mut model.config;
    let yarn = Yarn::new(c.n_rot, 10_000.0, 4.0, 64, (32.0, 1.0), 1.0);
    for (il, b) in c.blocks.iter_mut().enumerate() {
        b.attn.sinks = true;
        b.attn.out_bias = true;
        b.attn.rope.kind = crate::config::RopeType::Neox;
        b.attn.rope.scale = 0.25;
        b.attn.rope.yarn = Some(yarn);
        b.attn.kind = if il % 2 == 0 {
            AttnKind::SlidingWindow(4)
        } else {
            AttnKind::Full
        };
    }
    let (n_head, n_embd) = (c.n_head, c.n_embd);
    for b in &mut model.weights.blk {
        // sinks in the scores' range, so that they matter
        b.attn_sinks = Some(random_vec(r, n_head).iter().map(|x| 2.0 * x).collect());
        b.attn_output_bias = Some(random_vec(r, n_embd));
    }
    model
}

#[test]
fn gpt_oss_attention_runs_on_the_gpu_as_on_the_cpu_reference() {
    let Some(ctx) = gpu_or_skip("gpt_oss_attention_runs_on_the_gpu") else {
        return;
    };
    let mut r = rng("gpu_arch_gpt_oss_attention");
    let model = gpt_oss_attention_model(&mut r);
    let gm = GpuModel::load(&ctx, &model).expect("gpu model");
    let bound = if gm.kernels().linear.uses_coop(16) {
        5e-3
    } else {
        1e-4
    };
    // a prompt past the window, then decode steps (the fused decode attention)
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
    assert!(err <= bound, "prompt logits off by {err}");
    let mut cpu = model.session(32);
    cpu.forward(&tokens, 0, Logits::None).expect("cpu prefill");
    let mut steps = Vec::new();
    for (i, &t) in [3u32, 7, 11].iter().enumerate() {
        let pos = tokens.len() + i;
        let want = cpu.forward(&[t], pos, Logits::Last).expect("cpu step");
        let got = s.forward(&[t], pos, Logits::Last).expect("gpu step");
        let err = rel_err(&got, &want);
        assert!(err <= bound, "decode step {i} off by {err}");
        steps.push(want);
    }

    // the batched engine: the prompt in slot 1 (every row's logits), then a decode row
    let mut b = gm.batch(2, 32, 16).expect("gpu batch");
    let row = |pos: usize, t: u32| BatchRow {
        slot: 1,
        pos: pos as u32,
        token: TokenIn::Id(t),
        output: RowOutput::Logits,
        adapter: None,
    };
    let prompt: Vec<BatchRow> = tokens.iter().enumerate().map(|(p, &t)| row(p, t)).collect();
    let got: Vec<f32> = b
        .step(&prompt)
        .expect("batch prompt")
        .iter()
        .flat_map(|x| match x {
            RowResult::Logits(l) => l.clone(),
            other => panic!("expected logits, got {other:?}"),
        })
        .collect();
    let err = rel_err(&got, &want);
    assert!(err <= bound, "batch prompt logits off by {err}");
    let got = b.step(&[row(tokens.len(), 3)]).expect("batch decode");
    let RowResult::Logits(got) = &got[0] else {
        panic!("expected logits, got {:?}", got[0]);
    };
    let err = rel_err(got, &steps[0]);
    assert!(err <= bound, "batch decode row off by {err}");
}
