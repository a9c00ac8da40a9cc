//! The GPU decode chain on a real model (SmolLM2): several steps per submit with the sampled
//! token fed back on the GPU must give exactly what one-token-at-a-time decoding gives, stop
//! where it should, and sample as the CPU sampler does; GPU logits track the CPU reference.

mod common;

use common::*;
use octoflow_core::sampling::{Sampler, SamplingParams};
use octoflow_core::{Draw, Finish};
use octoflow_model::gpu::GpuModel;
use octoflow_model::{Forward, Logits};
use octoflow_vk::testing::gpu_or_skip;

#[test]
fn gpu_logits_track_the_cpu_reference() {
    let Some(ctx) = gpu_or_skip("gpu_logits_track_the_cpu_reference") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let gpu = GpuModel::load(&ctx, &model).unwrap();
    let prompt = &golden.greedy[1].prompt_ids;
    let want = model.session(64).forward(prompt, 0, Logits::All).unwrap();
    let got = gpu
        .session(64, 4)
        .unwrap()
        .forward(prompt, 0, Logits::All)
        .unwrap();
    assert_logits_close(&ctx, prompt.len(), &got, &want, "prompt logits");
}

/// Greedy tokens from the GPU chain (`steps` per submit) after `prompt`, `n` of them.
fn chain_tokens(gpu: &GpuModel, prompt: &[u32], n: usize, steps: usize, gated: bool) -> Vec<u32> {
    let mut s = gpu.session(256, steps).unwrap();
    s.set_gated(gated);
    let logits = s.prefill(prompt, 256).unwrap();
    let mut out = vec![top1(&logits)];
    while out.len() < n {
        let last = *out.last().unwrap();
        let r = s
            .decode_steps(last, &Draw::greedy(0), n - out.len(), &[])
            .unwrap();
        assert!(!r.tokens.is_empty());
        out.extend(&r.tokens);
        assert_eq!(
            s.n_past(),
            prompt.len() + out.len() - 1,
            "every token but the last was fed"
        );
    }
    out
}

#[test]
fn multi_step_chain_equals_token_by_token_decoding_and_stops_on_its_flags() {
    let Some(ctx) = gpu_or_skip("multi_step_chain_equals_token_by_token") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let gpu = GpuModel::load(&ctx, &model).unwrap();
    let prompt = &golden.greedy[0].prompt_ids;
    let n = 20;

    let mut s = gpu.session(256, 1).unwrap();
    let mut want = vec![top1(&s.prefill(prompt, 256).unwrap())];
    while want.len() < n {
        let logits = s.decode(*want.last().unwrap()).unwrap();
        want.push(top1(&logits));
    }
    for gated in [true, false] {
        for steps in [1, 3, 8] {
            assert_eq!(
                chain_tokens(&gpu, prompt, n, steps, gated),
                want,
                "{steps} steps per submit, gated {gated}"
            );
        }

        // An end-of-generation id stops the chain right after it is sampled; the steps left in
        // the submit (skipped when gated, run to no effect when not) leave nothing behind: the
        // sequence continues as if decoded token by token.
        let mut s = gpu.session(256, 16).unwrap();
        s.set_gated(gated);
        s.prefill(prompt, 256).unwrap();
        let eog = want[6];
        let first = (1..=6).find(|&j| want[j] == eog).unwrap_or(6);
        let r = s
            .decode_steps(want[0], &Draw::greedy(0), 100, &[eog])
            .unwrap();
        assert_eq!(r.stop, Some(Finish::Eog), "gated {gated}");
        assert_eq!(r.tokens, want[1..=first].to_vec(), "gated {gated}");
        assert_eq!(s.n_past(), prompt.len() + first, "gated {gated}");
        let more = s
            .decode_steps(want[first], &Draw::greedy(0), 5, &[])
            .unwrap();
        assert_eq!(
            more.tokens,
            want[first + 1..first + 6].to_vec(),
            "gated {gated}"
        );
        // The token limit and the context size stop it too.
        let mut s = gpu.session(256, 16).unwrap();
        s.set_gated(gated);
        s.prefill(prompt, 256).unwrap();
        let r = s.decode_steps(want[0], &Draw::greedy(0), 3, &[]).unwrap();
        assert_eq!((r.stop, r.tokens.len()), (Some(Finish::Length), 3));
        let n_ctx = prompt.len() + 5;
        let mut s = gpu.session(n_ctx, 16).unwrap();
        s.set_gated(gated);
        s.prefill(prompt, 256).unwrap();
        let r = s.decode_steps(want[0], &Draw::greedy(0), 100, &[]).unwrap();
        assert_eq!(r.stop, Some(Finish::Context));
        assert_eq!(
            s.n_past() + 1,
            n_ctx,
            "stops when no position is left for the last token (gated {gated})"
        );
    }
}

#[test]
fn seeded_gpu_sampling_draws_what_the_cpu_sampler_draws() {
    let Some(ctx) = gpu_or_skip("seeded_gpu_sampling_draws_what_the_cpu_sampler_draws") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let gpu = GpuModel::load(&ctx, &model).unwrap();
    let prompt = &golden.greedy[2].prompt_ids;
    let seed: u64 = rand::random();
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        seed,
        ..SamplingParams::default()
    };
    let n = 24;
    // CPU sampler over the GPU's logits, one token at a time.
    let mut s = gpu.session(256, 1).unwrap();
    let mut sampler = Sampler::new(params.clone());
    let mut want = vec![sampler.sample(&s.prefill(prompt, 256).unwrap())];
    while want.len() < n {
        let logits = s.decode(*want.last().unwrap()).unwrap();
        want.push(sampler.sample(&logits));
    }
    // The GPU sampler inside the chain, continuing from draw 1.
    let mut s = gpu.session(256, 8).unwrap();
    let mut sampler = Sampler::new(params.clone());
    let mut got = vec![sampler.sample(&s.prefill(prompt, 256).unwrap())];
    while got.len() < n {
        let draw = Draw::from_sampler(&sampler).unwrap();
        let r = s
            .decode_steps(*got.last().unwrap(), &draw, n - got.len(), &[])
            .unwrap();
        sampler.skip(r.tokens.len() as u64);
        got.extend(r.tokens);
    }
    assert_eq!(got, want, "seed {seed}");
}

#[test]
fn dropping_a_model_and_its_sessions_frees_every_buffer() {
    let Some(ctx) = gpu_or_skip("dropping_a_model_and_its_sessions_frees_every_buffer") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let before = ctx.memory_usage().0;
    for _ in 0..2 {
        let gpu = GpuModel::load(&ctx, &model).unwrap();
        let mut s = gpu.session(64, 4).unwrap();
        let logits = s.prefill(&golden.greedy[0].prompt_ids, 256).unwrap();
        s.decode_steps(top1(&logits), &Draw::greedy(0), 4, &[])
            .unwrap();
        let held = ctx.memory_usage().0;
        // weights, KV cache and scratch are all on the device while the session lives
        assert!(
            held >= before + gpu.weight_bytes() + s.bytes(),
            "{held} bytes held"
        );
        drop(s);
        drop(gpu);
        assert_eq!(
            ctx.memory_usage().0,
            before,
            "buffers left behind after unload"
        );
    }
    octoflow_vk::testing::assert_no_validation_errors(&ctx);
}
