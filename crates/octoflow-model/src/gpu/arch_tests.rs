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
    for arch in [
        "llama", "qwen2", "qwen3", "gemma3", "phi3", "qwen3moe", "gpt-oss",
    ] {
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

/// A tiny llama whose attention is gpt-oss's (its feed-forward a GLU, so that the attention
/// pieces are checked on their own, also in the batch engine): learned sink logits, an output bias, NeoX RoPE with YaRN over an
/// original context of 64 (its ramp inside the tiny head's pairs) and a window of 4 on even
/// layers.
fn gpt_oss_attention_model(r: &mut rand::rngs::StdRng) -> Model {
    let mut model = tiny_model("llama", TINY, r);
    let c = &mut model.config;
    let yarn = Yarn::new(c.n_rot, 10_000.0, 4.0, 64, (32.0, 1.0), 1.0, true);
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

/// The index of the largest logit and its margin over the second.
fn top1_margin(logits: &[f32]) -> (u32, f32) {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    (order[0] as u32, logits[order[0]] - logits[order[1]])
}

/// The mixture-of-experts feed-forward in the other two GPU users: the multi-step decode chain
/// (sampled tokens fed back on the GPU, several steps per submit) and the batched engine (rows
/// of several sequences in one step, batches large enough for the grouped expert products and
/// small ones for the expert matvec), each against the CPU reference of each sequence alone.
#[test]
fn qwen3moe_decode_chain_and_batched_rows_match_the_cpu_reference() {
    let Some(ctx) = gpu_or_skip("qwen3moe_decode_chain_and_batched_rows") else {
        return;
    };
    let mut r = rng("gpu_qwen3moe_users");
    let model = tiny_model("qwen3moe", TINY, &mut r);
    let gm = GpuModel::load(&ctx, &model).expect("gpu model");
    let bound = if gm.kernels().linear.uses_coop(16) {
        5e-3
    } else {
        1e-4
    };
    let prompt = |r: &mut rand::rngs::StdRng, n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| r.gen_range(0..TINY.n_vocab as u32))
            .collect()
    };
    let cpu_last = |tokens: &[u32]| {
        model
            .session(32)
            .forward(tokens, 0, Logits::Last)
            .expect("cpu forward")
    };

    // the decode chain: 6 greedy tokens, 3 steps per submit; each is the CPU reference's top
    // token wherever that is clear of the second (the GPU sums in another order, and its
    // prompt may run on f16-rounded operands)
    let p = prompt(&mut r, 9);
    let mut s = gm.session(32, 3).expect("gpu session");
    let first = top1_margin(&s.prefill(&p, 32).expect("gpu prefill")).0;
    let mut tokens = vec![first];
    while tokens.len() < 7 {
        let last = tokens[tokens.len() - 1];
        let steps = s
            .decode_steps(last, &octoflow_core::Draw::greedy(0), 7 - tokens.len(), &[])
            .expect("gpu decode chain");
        assert!(!steps.tokens.is_empty());
        tokens.extend(&steps.tokens);
    }
    let mut seq = p.clone();
    seq.push(first);
    for (i, &t) in tokens[1..].iter().enumerate() {
        let cpu = cpu_last(&seq);
        let (want, margin) = top1_margin(&cpu);
        // a margin within twice the logit bound of the largest logit is not clear
        let clear = 2.0 * bound * cpu.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            t == want || margin < clear,
            "decode chain step {i}: token {t}, the CPU reference's {want} (margin {margin})"
        );
        seq.push(t);
    }

    // the batched engine: 15 rows (grouped products), then 6 rows of two sequences and a
    // single row (the matvec)
    let row = |slot, pos, token, last: bool| BatchRow {
        slot,
        pos,
        token: TokenIn::Id(token),
        output: if last {
            RowOutput::Logits
        } else {
            RowOutput::None
        },
        adapter: None,
    };
    let rows = |slot: u32, start: usize, tokens: &[u32]| -> Vec<BatchRow> {
        let n = tokens.len();
        (0..n)
            .map(|i| row(slot, (start + i) as u32, tokens[i], i + 1 == n))
            .collect()
    };
    let (a, b) = (prompt(&mut r, 10), prompt(&mut r, 10));
    let mut eng = gm.batch(3, 32, 32).expect("gpu batch");
    let check = |res: &RowResult, tokens: &[u32], what: &str| {
        let RowResult::Logits(got) = res else {
            panic!("{what}: expected logits, got {res:?}");
        };
        let err = rel_err(got, &cpu_last(tokens));
        assert!(err <= bound, "{what}: logits off by {err}");
    };
    let mut step = rows(1, 0, &a);
    step.extend(rows(0, 0, &b[..5]));
    let res = eng.step(&step).expect("step 1");
    check(&res[9], &a, "step 1, slot 1");
    check(&res[14], &b[..5], "step 1, slot 0");
    let mut step = rows(0, 5, &b[5..]);
    step.extend(rows(1, 10, &[3]));
    let res = eng.step(&step).expect("step 2");
    check(&res[4], &b, "step 2, slot 0");
    let a3: Vec<u32> = a.iter().copied().chain([3]).collect();
    check(&res[5], &a3, "step 2, slot 1");
    let res = eng.step(&rows(1, 11, &[7])).expect("step 3");
    let a4: Vec<u32> = a3.iter().copied().chain([7]).collect();
    check(&res[0], &a4, "step 3, slot 1");
}

/// The tiny gpt-oss with MXFP4 experts through the batch engine with its expert products on
/// 8-bit dot products, a step's pairs taken one by one (`with_dot_groups(0)`; and with the GLU's
/// input quantized by the fused router, `with_xq`) and grouped by expert (steps of 2–8 rows
/// group their pairs too): each sequence's logits within what 8-bit
/// codes of the experts' inputs move them from the CPU reference's, and the two layouts alike
/// wherever their histories are (the same codes, the same sums per pair).
#[test]
fn gpt_oss_grouped_expert_dot_products_match_the_cpu_reference() {
    let Some(ctx) = octoflow_vk::testing::gpu_with_integer_dot_or_skip("gpu_gpt_oss_grouped_dot")
    else {
        return;
    };
    let mut r = rng("gpu_gpt_oss_grouped_dot");
    let mut w = crate::testing::tiny_writer("gpt-oss", TINY, &mut r);
    crate::testing::quantize_experts(&mut w, octoflow_gguf::GgmlType::MXFP4);
    let file = crate::testing::open(&w).expect("tiny model parses");
    let model = Model::from_gguf(std::sync::Arc::new(file)).expect("tiny model binds");
    let prompt = |r: &mut rand::rngs::StdRng, n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| r.gen_range(0..TINY.n_vocab as u32))
            .collect()
    };
    let seqs = [prompt(&mut r, 4), prompt(&mut r, 4), prompt(&mut r, 10)];
    // step 1: three rows of sequences 0 and 1 (6 rows); step 2: their fourth tokens (2 rows);
    // step 3: sequence 2's prompt beside them (12 rows: grouped either way)
    let plan: [&[(u32, std::ops::Range<usize>)]; 3] = [
        &[(0, 0..3), (1, 0..3)],
        &[(0, 3..4), (1, 3..4)],
        &[(2, 0..10), (0, 3..4), (1, 3..4)],
    ];
    let run = |groups: u32, xq: bool| -> Vec<Vec<f32>> {
        let ex = octoflow_kernels::MoeExperts::new()
            .with_dot(ctx.caps(), true)
            .with_dot_groups(groups)
            .with_xq(xq);
        assert_eq!(
            ex.groups_use_dot(octoflow_gguf::GgmlType::MXFP4, TINY.n_embd as u32, 8, true),
            groups >= 8
        );
        let gm = GpuModel::load(&ctx, &model)
            .expect("gpu model")
            .with_moe_experts(ex);
        let mut eng = gm.batch(3, 32, 16).expect("gpu batch");
        let mut out = Vec::new();
        for (si, step) in plan.iter().enumerate() {
            // step 3 repeats the decode rows of step 2 at the same positions (the cache rows
            // are written again with the same values)
            let rows: Vec<BatchRow> = step
                .iter()
                .flat_map(|(slot, range)| {
                    let s = &seqs[*slot as usize];
                    range.clone().map(move |p| BatchRow {
                        slot: *slot,
                        pos: p as u32,
                        token: TokenIn::Id(s[p]),
                        output: if p + 1 == range.end {
                            RowOutput::Logits
                        } else {
                            RowOutput::None
                        },
                        adapter: None,
                    })
                })
                .collect();
            for res in eng.step(&rows).unwrap_or_else(|e| panic!("step {si}: {e}")) {
                match res {
                    RowResult::Logits(l) => out.push(l),
                    RowResult::None => {}
                    other => panic!("step {si}: {other:?}"),
                }
            }
        }
        out
    };
    let (one_by_one, grouped) = (run(0, false), run(u32::MAX, false));
    // the routers of the few-row steps write the GLU's input quantized (the same codes of the
    // same values): the same logits
    let quantized_by_router = run(0, true);
    // the CPU reference's last logits, and whether some token of the sequence has router
    // logits at a near-tie between its 2nd and 3rd expert in some layer (the 8-bit codes of
    // the experts' inputs may then route it otherwise: a different model from there on)
    let cpu_last = |slot: usize, end: usize| {
        let mut tie = false;
        let logits = model
            .session(32)
            .forward_observed(&seqs[slot][..end], 0, Logits::Last, &mut |t| {
                if t.name == "ffn_moe_logits" {
                    for lg in t.data.chunks(t.data.len() / t.n_rows) {
                        let mut s = lg.to_vec();
                        s.sort_by(|a, b| b.total_cmp(a));
                        let top = s.iter().fold(0f32, |m, v| m.max(v.abs()));
                        tie |= s[1] - s[2] < 0.02 * top;
                    }
                }
            })
            .expect("cpu forward");
        (logits, tie)
    };
    let want = [
        cpu_last(0, 3),
        cpu_last(1, 3),
        cpu_last(0, 4),
        cpu_last(1, 4),
        cpu_last(2, 10),
        cpu_last(0, 4),
        cpu_last(1, 4),
    ];
    assert_eq!((one_by_one.len(), grouped.len()), (want.len(), want.len()));
    // each expert input's codes off by up to half a step of its block's largest value, in
    // every layer (the bound of steps whose every product reads such codes)
    const DOT: f32 = 8e-2;
    let mut clear = 0;
    for (i, (w, tie)) in want.iter().enumerate() {
        if *tie {
            continue;
        }
        clear += 1;
        for (what, got) in [
            ("pairs one by one", &one_by_one[i]),
            ("grouped", &grouped[i]),
        ] {
            let err = rel_err(got, w);
            assert!(err <= DOT, "{what}, logits {i}: off by {err}");
        }
    }
    println!(
        "{clear} of {} logits clear of routing near-ties",
        want.len()
    );
    // the first four share their whole history (steps of 6 and 2 rows); the products' sums
    // differ only in the order the down products' pairs are added into the stream
    for i in 0..4 {
        let err = rel_err(&grouped[i], &one_by_one[i]);
        assert!(
            err <= 1e-5,
            "logits {i}: grouped and one by one differ by {err}"
        );
    }
    for (i, (a, b)) in quantized_by_router.iter().zip(&one_by_one).enumerate() {
        assert_eq!(a, b, "logits {i}: the router's q8 input differs");
    }
    // the 12-row step took the grouped dot products (one by one, it takes the grouped f32 or
    // f16 products there)
    assert!(
        rel_err(&grouped[4], &one_by_one[4]) > 1e-5,
        "the 12-row step's experts did not read 8-bit codes"
    );
}
