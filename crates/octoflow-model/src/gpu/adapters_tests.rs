//! Adapters applied on the fly on the GPU give the logits of the CPU reference running the base
//! with the same adapters merged into its weights (tiny random models of every architecture):
//! several adapters with their scales in a session, and per-row adapters in one batched step.
//! Also the fused FFN of few-token steps (gate, up and activation in one dispatch), which layers
//! with adapters on gate or up must not take.

use std::sync::Arc;

use octoflow_vk::testing::gpu_or_skip;
use rand::Rng;

use crate::adapter::{merged_file, Adapter, Target};
use crate::gpu::GpuModel;
use crate::testing::{open, random_adapter, rel_err, rng, tiny_writer, TINY};
use crate::{BatchForward, BatchRow, Forward, Logits, Model, RowOutput, RowResult, TokenIn};

/// The CPU reference over `base` with `adapters` merged (F32).
fn merged_model(base: &Arc<octoflow_gguf::GgufFile>, adapters: &[(&Adapter, f32)]) -> Model {
    Model::from_gguf(Arc::new(merged_file(base, adapters).expect("merge"))).expect("merged model")
}

/// The bound on the logits' error relative to their largest value (the adapters move them by
/// more than 1e-2). f32 math on both sides, different summation orders: ~1e-6 per product, 1e-4
/// bound; where batches run on cooperative matrices (H100), the base products are of
/// f16-rounded operands (~5e-4 per product; 1.5e-3 measured): 5e-3.
fn bound(gm: &GpuModel) -> f32 {
    if gm.kernels().linear.uses_coop(16) {
        5e-3
    } else {
        1e-4
    }
}

#[test]
fn adapters_on_the_fly_match_the_merged_model() {
    let Some(ctx) = gpu_or_skip("adapters_on_the_fly") else {
        return;
    };
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        let mut rng = rng(&format!("adapters_on_the_fly_{arch}"));
        let base = Arc::new(open(&tiny_writer(arch, TINY, &mut rng)).expect("tiny model"));
        let model = Model::from_gguf(base.clone()).expect("model");
        let c = model.config.clone();
        let a1 = random_adapter("a1", &c, 3, 6.0, &Target::ALL, &[0, 1], 0.4, &mut rng);
        // no alpha (scale = user scale), a subset of targets, one layer only
        let a2 = random_adapter(
            "a2",
            &c,
            5,
            0.0,
            &[Target::Q, Target::O, Target::Down],
            &[1],
            0.4,
            &mut rng,
        );
        let scales = [0.7f32, -1.3];
        let cpu = merged_model(&base, &[(&a1, scales[0]), (&a2, scales[1])]);
        let mut gm = GpuModel::load(&ctx, &model).expect("gpu model");
        let tokens: Vec<u32> = (0..12)
            .map(|_| rng.gen_range(0..TINY.n_vocab as u32))
            .collect();

        let base_gpu = {
            let mut s = gm.session(32, 4).expect("session");
            s.forward(&tokens, 0, Logits::All).expect("base forward")
        };
        gm.set_adapters(&[a1.clone(), a2.clone()], &scales)
            .expect("adapters");
        let mut s = gm.session(32, 4).expect("session");
        // a prompt batch, then single-token steps (the decode shape)
        let mut got = s.forward(&tokens[..9], 0, Logits::All).expect("forward");
        for (i, &t) in tokens[9..].iter().enumerate() {
            got.extend(s.forward(&[t], 9 + i, Logits::All).expect("step"));
        }
        let want = cpu
            .session(32)
            .forward(&tokens, 0, Logits::All)
            .expect("cpu");
        let e = rel_err(&got, &want);
        assert!(e < bound(&gm), "{arch}: on the fly vs merged: {e:.2e}");
        let moved = rel_err(&base_gpu, &want);
        assert!(
            moved > 1e-2,
            "{arch}: the adapters barely change the logits ({moved:.2e})"
        );

        // GPU decode steps (tokens sampled on the device) follow the merged model's greedy path
        let mut steps = gm.session(32, 4).expect("session");
        steps
            .forward(&tokens[..5], 0, Logits::None)
            .expect("prompt");
        let out = steps
            .decode_steps(tokens[5], &octoflow_core::Draw::greedy(0), 4, &[])
            .expect("decode");
        let mut cs = cpu.session(32);
        let mut logits = cs.forward(&tokens[..6], 0, Logits::Last).expect("cpu");
        for &t in &out.tokens {
            let best = crate::ops::argmax(&logits).map(|(i, _)| i as u32);
            // a near-tie may flip the choice; then the paths part and the check ends
            let mut sorted = logits.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if best != Some(t) && sorted[0] - sorted[1] < 1e-3 {
                break;
            }
            assert_eq!(Some(t), best, "{arch}: greedy token differs");
            let p = cs.n_past();
            logits = cs.forward(&[t], p, Logits::Last).expect("cpu step");
        }

        // scale 0 for both: the base model again
        drop((s, steps));
        gm.adapters_mut()
            .expect("adapters")
            .set_scales(&[0.0, 0.0])
            .expect("scales");
        let mut s = gm.session(32, 4).expect("session");
        let zero = s.forward(&tokens, 0, Logits::All).expect("forward");
        let e = rel_err(&zero, &base_gpu);
        assert!(e < 1e-6, "{arch}: scale 0 is not the base ({e:.2e})");
    }
}

#[test]
fn batch_rows_use_their_own_adapter() {
    let Some(ctx) = gpu_or_skip("batch_rows_use_their_own_adapter") else {
        return;
    };
    let mut rng = rng("batch_rows_use_their_own_adapter");
    let base = Arc::new(open(&tiny_writer("qwen2", TINY, &mut rng)).expect("tiny model"));
    let model = Model::from_gguf(base.clone()).expect("model");
    let c = model.config.clone();
    let a0 = random_adapter("a0", &c, 4, 8.0, &Target::ALL, &[0, 1], 0.4, &mut rng);
    let a1 = random_adapter(
        "a1",
        &c,
        2,
        2.0,
        &[Target::V, Target::Up],
        &[0],
        0.4,
        &mut rng,
    );
    let scales = [1.0f32, 1.5];
    let cpu = [
        model.clone(),
        merged_model(&base, &[(&a0, scales[0])]),
        merged_model(&base, &[(&a1, scales[1])]),
    ];
    let mut gm = GpuModel::load(&ctx, &model).expect("gpu model");
    gm.set_adapters(&[a0, a1], &scales).expect("adapters");
    let rel = bound(&gm);
    let mut b = gm.batch(3, 32, 64).expect("batch");
    let adapters = [None, Some(0), Some(1)];
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            (0..5 + i)
                .map(|_| rng.gen_range(0..TINY.n_vocab as u32))
                .collect()
        })
        .collect();
    // every slot's prompt in one step, rows interleaved so neighbouring rows use different adapters
    let mut rows = Vec::new();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    for p in 0..longest {
        for (slot, prompt) in prompts.iter().enumerate() {
            if p < prompt.len() {
                rows.push(BatchRow {
                    slot: slot as u32,
                    pos: p as u32,
                    token: TokenIn::Id(prompt[p]),
                    output: if p + 1 == prompt.len() {
                        RowOutput::Logits
                    } else {
                        RowOutput::None
                    },
                    adapter: adapters[slot],
                });
            }
        }
    }
    b.submit(&rows).expect("submit");
    let results = b.collect().expect("collect");
    let mut seen = 0;
    for (r, res) in rows.iter().zip(&results) {
        let RowResult::Logits(got) = res else {
            continue;
        };
        let slot = r.slot as usize;
        let want = cpu[slot]
            .session(32)
            .forward(&prompts[slot], 0, Logits::Last)
            .expect("cpu");
        let e = rel_err(got, &want);
        assert!(
            e < rel,
            "slot {slot} (adapter {:?}): {e:.2e}",
            adapters[slot]
        );
        seen += 1;
    }
    assert_eq!(seen, 3);
    // an adapter index past the loaded ones is a clear error
    let bad = [BatchRow {
        slot: 0,
        pos: prompts[0].len() as u32,
        token: TokenIn::Id(1),
        output: RowOutput::Logits,
        adapter: Some(2),
    }];
    let e = b.submit(&bad).expect_err("bad adapter").to_string();
    assert!(e.contains("adapter 2"), "{e}");
}

/// The logits of 15 tokens fed as a 9-token prompt, a 3-token step and three single tokens.
fn steps(gm: &GpuModel, tokens: &[u32]) -> Vec<f32> {
    let mut s = gm.session(32, 4).expect("session");
    let mut got = s.forward(&tokens[..9], 0, Logits::All).expect("prompt");
    got.extend(s.forward(&tokens[9..12], 9, Logits::All).expect("3 tokens"));
    for p in 12..15 {
        got.extend(
            s.forward(&tokens[p..p + 1], p, Logits::All)
                .expect("1 token"),
        );
    }
    got
}

/// Steps of at most 8 tokens record each layer's gate, up and activation as one dispatch
/// ([`octoflow_kernels::Linear::record_glu`]) unless adapters touch that layer's gate or up. The
/// base model (fused in every layer) and the base with an adapter on layer 1's gate and up only
/// (layer 0 fused, layer 1 not) give the CPU reference's logits over a 9-token prompt (the
/// matrix path), then a step of 3 tokens and three of 1 token (norms fused into the
/// projections, and for gemma3 its post-norms left to the next block's input,
/// `Graph::defers_post_norms`); on a CPU driver, whose kernels fuse no norm, the base model also
/// through the GPU kernels.
#[test]
fn fused_ffn_steps_match_the_cpu_reference() {
    let Some(ctx) = gpu_or_skip("fused_ffn_steps") else {
        return;
    };
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        let mut rng = rng(&format!("fused_ffn_steps_{arch}"));
        let base = Arc::new(open(&tiny_writer(arch, TINY, &mut rng)).expect("tiny model"));
        let model = Model::from_gguf(base.clone()).expect("model");
        let c = model.config.clone();
        let a = random_adapter(
            "gate_up",
            &c,
            3,
            6.0,
            &[Target::Gate, Target::Up],
            &[1],
            0.4,
            &mut rng,
        );
        let scale = 0.8f32;
        let mut gm = GpuModel::load(&ctx, &model).expect("gpu model");
        let tokens: Vec<u32> = (0..15)
            .map(|_| rng.gen_range(0..TINY.n_vocab as u32))
            .collect();
        let mut runs = Vec::new();
        for adapted in [false, true] {
            let cpu = if adapted {
                gm.set_adapters(std::slice::from_ref(&a), &[scale])
                    .expect("adapters");
                merged_model(&base, &[(&a, scale)])
            } else {
                model.clone()
            };
            let got = steps(&gm, &tokens);
            let want = cpu
                .session(32)
                .forward(&tokens, 0, Logits::All)
                .expect("cpu");
            let e = rel_err(&got, &want);
            assert!(e < bound(&gm), "{arch} (adapter {adapted}): {e:.2e}");
            runs.push(got);
        }
        if ctx.caps().kind == octoflow_vk::DeviceKind::Cpu {
            let gl = GpuModel::load_gpu_layout(&ctx, &model).expect("gpu layout");
            let got = steps(&gl, &tokens);
            let want = model
                .session(32)
                .forward(&tokens, 0, Logits::All)
                .expect("cpu");
            let e = rel_err(&got, &want);
            assert!(
                e < bound(&gm),
                "{arch} (GPU kernels on a CPU driver): {e:.2e}"
            );
        }
        let moved = rel_err(&runs[1], &runs[0]);
        assert!(
            moved > 1e-2,
            "{arch}: the adapter barely changes the logits ({moved:.2e})"
        );
    }
}
