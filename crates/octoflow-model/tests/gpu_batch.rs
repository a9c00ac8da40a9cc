//! The batched GPU engine (`GpuBatch`) on a real model (SmolLM2): rows of several sequences in
//! one step — prompt chunks and decode tokens mixed, slots reused — give each sequence the
//! logits the CPU reference gives it alone; pipelined steps feed sampled tokens on the GPU; bad
//! steps are clear errors.

mod common;

use common::*;
use octoflow_core::{Draw, TokenMask};
use octoflow_kernels::DotBatches;
use octoflow_model::gpu::{GpuModel, KvType};
use octoflow_model::{
    BatchForward, BatchRow, Forward, Logits, Model, RowOutput, RowResult, TokenIn,
};
use octoflow_vk::testing::{gpu_or_skip, gpu_with_integer_dot_or_skip};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Rows feeding `tokens` to `slot` from position `start`; the last one asks for `out`.
fn rows(slot: u32, start: u32, tokens: &[u32], out: RowOutput) -> Vec<BatchRow> {
    let n = tokens.len();
    tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| BatchRow {
            slot,
            pos: start + i as u32,
            token: TokenIn::Id(t),
            output: if i + 1 == n { out } else { RowOutput::None },
            adapter: None,
        })
        .collect()
}

/// The CPU reference's logits after `tokens`.
fn cpu_last(model: &Model, tokens: &[u32]) -> Vec<f32> {
    model
        .session(64)
        .forward(tokens, 0, Logits::Last)
        .expect("cpu forward")
}

fn logits_of(r: &RowResult) -> &[f32] {
    match r {
        RowResult::Logits(l) => l,
        other => panic!("expected logits, got {other:?}"),
    }
}

/// A sampled row's token and its log-probability.
fn token_of(r: &RowResult) -> (u32, f32) {
    match r {
        RowResult::Token { token, logprob } => (*token, *logprob),
        other => panic!("expected a token, got {other:?}"),
    }
}

#[test]
fn rows_of_several_sequences_match_each_sequence_alone() {
    let Some(ctx) = gpu_or_skip("gpu_batch_rows_match") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let gpu = GpuModel::load(&ctx, &model).unwrap();
    let mut b = gpu.batch(4, 64, 64).unwrap();
    let p: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            golden.greedy[i]
                .prompt_ids
                .iter()
                .take(12)
                .copied()
                .collect()
        })
        .collect();
    let half = p[1].len() / 2;

    // step 1: all of prompt 0 in slot 2, the first half of prompt 1 in slot 0
    let mut step = rows(2, 0, &p[0], RowOutput::Logits);
    step.extend(rows(0, 0, &p[1][..half], RowOutput::Logits));
    let r = b.step(&step).unwrap();
    assert_eq!(r.len(), step.len());
    let last0 = p[0].len() - 1;
    assert!(r[..last0].iter().all(|x| *x == RowResult::None));
    assert_logits_close(
        &ctx,
        step.len(),
        logits_of(&r[last0]),
        &cpu_last(&model, &p[0]),
        "step 1, slot 2",
    );
    assert_logits_close(
        &ctx,
        step.len(),
        logits_of(&r[step.len() - 1]),
        &cpu_last(&model, &p[1][..half]),
        "step 1, slot 0",
    );
    let next0 = top1(logits_of(&r[last0]));

    // step 2: the rest of prompt 1, all of prompt 2 in slot 1, a decode token in slot 2
    let mut step = rows(0, half as u32, &p[1][half..], RowOutput::Logits);
    step.extend(rows(1, 0, &p[2], RowOutput::Logits));
    step.extend(rows(2, p[0].len() as u32, &[next0], RowOutput::Logits));
    let r = b.step(&step).unwrap();
    let (e0, e1) = (p[1].len() - half, p[1].len() - half + p[2].len());
    assert_logits_close(
        &ctx,
        step.len(),
        logits_of(&r[e0 - 1]),
        &cpu_last(&model, &p[1]),
        "step 2, slot 0",
    );
    assert_logits_close(
        &ctx,
        step.len(),
        logits_of(&r[e1 - 1]),
        &cpu_last(&model, &p[2]),
        "step 2, slot 1",
    );
    let mut seq2 = p[0].clone();
    seq2.push(next0);
    assert_logits_close(
        &ctx,
        step.len(),
        logits_of(&r[e1]),
        &cpu_last(&model, &seq2),
        "step 2, slot 2",
    );

    // steps 3 and 4 pipelined: greedy samples on the GPU, then fed back without the CPU
    let tails = [
        (0u32, p[1].clone(), top1(logits_of(&r[e0 - 1]))),
        (1, p[2].clone(), top1(logits_of(&r[e1 - 1]))),
        (2, seq2.clone(), top1(logits_of(&r[e1]))),
    ];
    let step3: Vec<BatchRow> = tails
        .iter()
        .map(|(slot, seq, next)| BatchRow {
            slot: *slot,
            pos: seq.len() as u32,
            token: TokenIn::Id(*next),
            output: RowOutput::Sample(Draw::greedy(0)),
            adapter: None,
        })
        .collect();
    let step4: Vec<BatchRow> = tails
        .iter()
        .map(|(slot, seq, _)| BatchRow {
            slot: *slot,
            pos: seq.len() as u32 + 1,
            token: TokenIn::Sampled,
            output: RowOutput::Logits,
            adapter: None,
        })
        .collect();
    b.submit(&step3).unwrap();
    b.submit(&step4).unwrap();
    assert_eq!(b.pending(), 2);
    assert!(b.submit(&step4).is_err(), "a third step in flight");
    let r3 = b.collect().unwrap();
    let r4 = b.collect().unwrap();
    for (i, (_, seq, next)) in tails.iter().enumerate() {
        let mut s = seq.clone();
        s.push(*next);
        let want3 = cpu_last(&model, &s);
        let (t, lp) = token_of(&r3[i]);
        // greedy on the GPU: the CPU's best, or a near-tie of it (within what the GPU's logits
        // may differ from the CPU's, twice: the history ran through up to 18-row steps)
        let best = want3.iter().fold(f32::MIN, |m, &v| m.max(v));
        let scale = want3.iter().fold(0f32, |m, v| m.max(v.abs()));
        let tie = 2.0 * gpu_logit_bound(&ctx, 18) * scale;
        assert!(
            best - want3[t as usize] <= tie,
            "slot {i}: sampled {t}, CPU logit {} vs best {best}",
            want3[t as usize]
        );
        // Its log-probability, `l - logsumexp(logits)`, moves by at most twice the logits'
        // largest error (`tie` is already twice it), plus the sum's rounding.
        let want_lp = octoflow_core::sampling::logprob(&want3, t);
        assert!(
            (lp - want_lp).abs() <= 2.0 * tie + 1e-4 * want_lp.abs().max(1.0),
            "slot {i}: log-probability {lp} vs CPU {want_lp}"
        );
        s.push(t);
        assert_logits_close(
            &ctx,
            18, // the sequences' history ran through steps of up to 18 rows
            logits_of(&r4[i]),
            &cpu_last(&model, &s),
            "step 4 (fed back)",
        );
    }

    // a finished slot is reused from position 0: its old positions are forgotten
    let r = b.step(&rows(2, 0, &p[1], RowOutput::Logits)).unwrap();
    assert_logits_close(
        &ctx,
        p[1].len(),
        logits_of(r.last().unwrap()),
        &cpu_last(&model, &p[1]),
        "slot reuse",
    );
}

/// `model` on the device with batches of 2–8 rows on 8-bit dot products (`dot`) or not.
fn dot_batches(ctx: &octoflow_vk::Context, model: &Model, dot: bool) -> GpuModel {
    let which = if dot {
        DotBatches::All
    } else {
        DotBatches::Off
    };
    with_dot_batches(ctx, model, which)
}

/// `model` on the device with `which` batches of 2–8 rows on 8-bit dot products.
fn with_dot_batches(ctx: &octoflow_vk::Context, model: &Model, which: DotBatches) -> GpuModel {
    let tuning = octoflow_kernels::Tuning {
        dot_batches: which,
        ..octoflow_kernels::Tuning::from_caps(ctx.caps())
    };
    let linear = octoflow_kernels::Linear::with_tuning(ctx, tuning).unwrap();
    GpuModel::load(ctx, model).unwrap().with_linear(linear)
}

/// The golden text fed eight rows a step (every row's logits) keeps llama.cpp's mean NLL.
fn check_nll_eight_rows_a_step(gpu: &GpuModel, golden: &Golden, name: &str) {
    let case = &golden.nll[0];
    let mut b = gpu.batch(1, case.token_ids.len(), 8).unwrap();
    let ids = &case.token_ids;
    let mut nll = 0f64;
    for (c, chunk) in ids[..ids.len() - 1].chunks(8).enumerate() {
        let step: Vec<BatchRow> = chunk
            .iter()
            .enumerate()
            .map(|(i, &t)| BatchRow {
                slot: 0,
                pos: (8 * c + i) as u32,
                token: TokenIn::Id(t),
                output: RowOutput::Logits,
                adapter: None,
            })
            .collect();
        let r = b.step(&step).unwrap();
        for (i, out) in r.iter().enumerate() {
            let next = ids[8 * c + i + 1];
            let out = match out {
                RowResult::Logits(l) => l,
                _ => panic!("{name}: row {i} of step {c}: no logits"),
            };
            nll -= f64::from(octoflow_core::sampling::logprob(out, next));
        }
    }
    let nll = nll / (ids.len() - 1) as f64;
    let rel = (nll - case.mean_nll).abs() / case.mean_nll;
    println!(
        "{name}: mean NLL eight rows a step: {nll:.5}, golden {:.5} ({:.3}%)",
        case.mean_nll,
        100.0 * rel
    );
    assert!(
        rel <= NLL_REL_TOL,
        "{name}: mean NLL {nll} vs golden {}",
        case.mean_nll
    );
}

/// qwen2.5's Q5_0, Q8_0, Q4_K and Q6_K products (and its q/k/v biases) eight rows a step on
/// 8-bit dot products keep llama.cpp's mean NLL, as smollm2's Q4_1 ones do below.
#[test]
fn qwen_eight_rows_a_step_on_8bit_dot_products_keeps_llama_cpps_nll() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("gpu_batch_dot_qwen") else {
        return;
    };
    let (model, golden) = load(QWEN25);
    check_nll_eight_rows_a_step(&dot_batches(&ctx, &model, true), &golden, QWEN25);
}

/// The same eight rows a step with every product's x quantized once for it
/// (`Tuning::quantize_once`: a dispatch into scratch, then the products read it) keeps
/// llama.cpp's mean NLL: the scratch between the attention block's products and the
/// feed-forward's holds each product's input until it has read it.
#[test]
fn eight_rows_a_step_on_x_quantized_once_keep_llama_cpps_nll() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("gpu_batch_dot_once") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let tuning = octoflow_kernels::Tuning {
        dot_batches: DotBatches::All,
        quantize_once: true,
        ..octoflow_kernels::Tuning::from_caps(ctx.caps())
    };
    let linear = octoflow_kernels::Linear::with_tuning(&ctx, tuning).unwrap();
    let gpu = GpuModel::load(&ctx, &model).unwrap().with_linear(linear);
    check_nll_eight_rows_a_step(&gpu, &golden, SMOLLM2);
}

/// Steps of two to eight rows on 8-bit dot products (`Tuning::dot_batches`, forced here
/// wherever the driver has integer dot products): the golden text fed eight rows a
/// step keeps llama.cpp's mean NLL (llama.cpp's own GPU products quantize x the same way);
/// prompt chunks and decode rows of three sequences give each the CPU reference's best token
/// and logits within what 8-bit codes of every product's input move them; and the path was
/// taken (the f32 products' logits differ).
#[test]
fn few_row_steps_on_8bit_dot_products_match_each_sequence_alone() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("gpu_batch_dot_rows") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let (gpu, plain) = (
        dot_batches(&ctx, &model, true),
        dot_batches(&ctx, &model, false),
    );
    let p: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            let g = &golden.greedy[i];
            g.prompt_ids
                .iter()
                .chain(&g.greedy_ids)
                .take(6)
                .copied()
                .collect()
        })
        .collect();
    // every product of every layer reads 8-bit codes of its input (each off by up to half a
    // step of its block's largest value)
    let bound = |got: &[f32], want: &[f32], what: &str| {
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| {
                if a.is_nan() {
                    f32::INFINITY
                } else {
                    (a - b).abs()
                }
            })
            .fold(0f32, f32::max);
        assert!(
            worst <= DOT_BATCH_LOGIT_BOUND * scale,
            "{what}: logits off by {worst} (largest |logit| {scale})"
        );
        assert_eq!(top1(got), top1(want), "{what}: best token");
    };
    check_nll_eight_rows_a_step(&gpu, &golden, SMOLLM2);
    let run = |m: &GpuModel| {
        let mut b = m.batch(4, 64, 64).unwrap();
        // 6 rows: two prompts' first halves; 8 rows: their second halves and a third prompt's
        // first two tokens; 4 rows: the rest of the third; 3 rows: a decode token each
        let mut s1 = rows(0, 0, &p[0][..3], RowOutput::Logits);
        s1.extend(rows(1, 0, &p[1][..3], RowOutput::Logits));
        let r1 = b.step(&s1).unwrap();
        let mut s2 = rows(0, 3, &p[0][3..], RowOutput::Logits);
        s2.extend(rows(1, 3, &p[1][3..], RowOutput::Logits));
        s2.extend(rows(2, 0, &p[2][..2], RowOutput::Logits));
        let r2 = b.step(&s2).unwrap();
        let r3 = b.step(&rows(2, 2, &p[2][2..], RowOutput::Logits)).unwrap();
        let s4: Vec<BatchRow> = (0..3)
            .flat_map(|i| rows(i, 6, &[7 + i], RowOutput::Logits))
            .collect();
        let r4 = b.step(&s4).unwrap();
        let l = |r: &RowResult| logits_of(r).to_vec();
        vec![
            (l(&r1[2]), p[0][..3].to_vec()),
            (l(&r1[5]), p[1][..3].to_vec()),
            (l(&r2[2]), p[0].clone()),
            (l(&r2[5]), p[1].clone()),
            (l(&r2[7]), p[2][..2].to_vec()),
            (l(&r3[3]), p[2].clone()),
            (l(&r4[0]), [&p[0][..], &[7]].concat()),
            (l(&r4[1]), [&p[1][..], &[8]].concat()),
            (l(&r4[2]), [&p[2][..], &[9]].concat()),
        ]
    };
    let got = run(&gpu);
    for (i, (logits, seq)) in got.iter().enumerate() {
        bound(logits, &cpu_last(&model, seq), &format!("row set {i}"));
    }
    let f32_products = run(&plain);
    assert!(
        got.iter().zip(&f32_products).any(|(a, b)| a.0 != b.0),
        "the 8-bit products were not taken"
    );
}

/// Only steps whose every row samples take the 8-bit dot products by default
/// (`DotBatches::Decode`): a step of prompt chunks gives the tokens and log-probabilities the
/// f32 products give, bit for bit; the next step, a sampled row per sequence, gives the CPU
/// reference's best tokens with log-probabilities within what its logits' bound allows, and
/// not the f32 products' bits.
#[test]
fn only_steps_whose_rows_all_sample_take_the_8bit_dot_products() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("gpu_batch_dot_decode") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let (decode, plain) = (
        with_dot_batches(&ctx, &model, DotBatches::Decode),
        with_dot_batches(&ctx, &model, DotBatches::Off),
    );
    let p: Vec<Vec<u32>> = (0..3)
        .map(|i| {
            golden.greedy[i]
                .prompt_ids
                .iter()
                .take(2)
                .copied()
                .collect()
        })
        .collect();
    let draw = RowOutput::Sample(Draw::greedy(0));
    let run = |m: &GpuModel| {
        let mut b = m.batch(4, 64, 64).unwrap();
        // 6 rows, 3 of them sampling: prompt chunks
        let s1: Vec<BatchRow> = (0..3)
            .flat_map(|i| rows(i, 0, &p[i as usize], draw))
            .collect();
        let r1 = b.step(&s1).unwrap();
        // 3 rows, each sampling: the decode rows
        let s2: Vec<BatchRow> = (0..3).flat_map(|i| rows(i, 2, &[7 + i], draw)).collect();
        let r2 = b.step(&s2).unwrap();
        let tok = |r: &RowResult| match r {
            RowResult::Token { token, logprob } => (*token, *logprob),
            other => panic!("a sampled row gave {other:?}"),
        };
        let prompt: Vec<(u32, f32)> = [1, 3, 5].iter().map(|&i| tok(&r1[i])).collect();
        let rows2: Vec<(u32, f32)> = r2.iter().map(tok).collect();
        (prompt, rows2)
    };
    let (got_prompt, got_decode) = run(&decode);
    let (want_prompt, want_decode) = run(&plain);
    let bits = |v: &[(u32, f32)]| v.iter().map(|&(t, l)| (t, l.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(&got_prompt), bits(&want_prompt), "prompt chunks");
    for (i, &(token, logprob)) in got_decode.iter().enumerate() {
        let seq = [&p[i][..], &[7 + i as u32]].concat();
        let cpu = cpu_last(&model, &seq);
        assert!(logprob.is_finite(), "row {i}: log-probability {logprob}");
        assert_eq!(token, top1(&cpu), "row {i}: best token");
        // a log-probability moves by at most twice its logits' largest error
        let want = octoflow_core::sampling::logprob(&cpu, token);
        let scale = cpu.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            (logprob - want).abs() <= 2.0 * DOT_BATCH_LOGIT_BOUND * scale,
            "row {i}: log-probability {logprob} vs the CPU's {want} (largest |logit| {scale})"
        );
    }
    assert_ne!(
        bits(&got_decode),
        bits(&want_decode),
        "the decode rows did not take the 8-bit products"
    );
}

/// The batch engine with f16 KV caches (the server's default) and with q8_0 ones: a prompt
/// chunk and decode rows in one slot give the logits a session with the same caches gives the
/// same tokens (both store the same keys and values rounded once; position tables and the
/// fused decode path alike).
#[test]
fn f16_and_q8_0_kv_caches_give_the_batch_what_they_give_a_session() {
    let Some(ctx) = gpu_or_skip("gpu_batch_f16_kv") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let mut gpu = GpuModel::load(&ctx, &model).unwrap();
    let p: Vec<u32> = golden.greedy[0]
        .prompt_ids
        .iter()
        .take(12)
        .copied()
        .collect();
    for kv in [KvType::F16, KvType::Q8_0] {
        if !kv.supported(ctx.caps()) {
            println!("{kv}: skipped, {} cannot hold such caches", ctx.caps().name);
            continue;
        }
        gpu.set_kv_type(kv).unwrap();
        let mut b = gpu.batch(2, 64, 64).unwrap();
        let r = b.step(&rows(1, 0, &p, RowOutput::Logits)).unwrap();
        let mut s = gpu.session(64, 4).unwrap();
        let mut want = s.forward(&p, 0, Logits::Last).unwrap();
        let what = |step: &str| format!("{kv} caches, {step}");
        assert_logits_close(
            &ctx,
            p.len(),
            logits_of(&r[p.len() - 1]),
            &want,
            &what("prompt"),
        );
        // two decode steps after it
        for pos in p.len()..p.len() + 2 {
            let next = top1(&want);
            let r = b
                .step(&rows(1, pos as u32, &[next], RowOutput::Logits))
                .unwrap();
            want = s.forward(&[next], pos, Logits::Last).unwrap();
            assert_logits_close(&ctx, 1, logits_of(&r[0]), &want, &what("decode"));
        }
    }
}

#[test]
fn bad_steps_are_clear_errors() {
    let Some(ctx) = gpu_or_skip("gpu_batch_bad_steps") else {
        return;
    };
    let (model, _) = load(SMOLLM2);
    let gpu = GpuModel::load(&ctx, &model).unwrap();
    let mut b = gpu.batch(2, 16, 8).unwrap();
    let row = |slot, pos, token| BatchRow {
        slot,
        pos,
        token,
        output: RowOutput::None,
        adapter: None,
    };
    let err = |b: &mut octoflow_model::gpu::GpuBatch, rows: &[BatchRow]| {
        b.submit(rows).unwrap_err().to_string()
    };
    assert!(err(&mut b, &[]).contains("empty"));
    assert!(err(&mut b, &[row(2, 0, TokenIn::Id(1))]).contains("slot 2 of 2"));
    assert!(err(&mut b, &[row(0, 3, TokenIn::Id(1))]).contains("caches only 0"));
    assert!(err(&mut b, &[row(0, 16, TokenIn::Id(1))]).contains("16"));
    assert!(err(&mut b, &[row(0, 0, TokenIn::Id(1 << 30))]).contains("vocab"));
    assert!(err(&mut b, &[row(0, 0, TokenIn::Sampled)]).contains("sampled none"));
    let jump = [row(0, 0, TokenIn::Id(1)), row(0, 2, TokenIn::Id(1))];
    assert!(err(&mut b, &jump).contains("jumps"));
    let many: Vec<BatchRow> = (0..9).map(|i| row(0, i, TokenIn::Id(1))).collect();
    assert!(err(&mut b, &many).contains("at most 8"));
    let hot = Draw {
        temperature: 0.7,
        top_k: 0,
        ..Draw::greedy(0)
    };
    let unsupported = [BatchRow {
        output: RowOutput::Sample(hot),
        adapter: None,
        ..row(0, 0, TokenIn::Id(1))
    }];
    assert!(err(&mut b, &unsupported).contains("top_k"));
    assert!(b.collect().is_err(), "nothing in flight");
    // nothing above was submitted: a good step still runs from position 0
    let ok = b.step(&[row(0, 0, TokenIn::Id(1))]).unwrap();
    assert_eq!(ok, vec![RowResult::None]);
}

/// The paged KV pool: a sequence whose prompt starts with a held one's adopts its whole blocks
/// (shared while the first still runs) and prefills only the rest; a rewind into a shared
/// block copies it first, so the other sequence goes on unchanged; a step the pool has no
/// room for is refused with the pool's error, and the other sequences lose nothing.
#[test]
fn paged_caches_share_prefixes_copy_on_rewind_and_refuse_when_full() {
    let Some(ctx) = gpu_or_skip("gpu_batch_paged") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let gpu = GpuModel::load(&ctx, &model).unwrap();
    let text = &golden.nll[0].token_ids;
    let a: Vec<u32> = text[..40].to_vec();
    let check = |got: &RowResult, tokens: &[u32], what: &str| {
        assert_logits_close(
            &ctx,
            tokens.len(),
            logits_of(got),
            &cpu_last(&model, tokens),
            what,
        );
    };

    let mut b = gpu.batch_with(3, 64, 64, 3 * 64).unwrap();
    let r = b.step(&rows(0, 0, &a, RowOutput::Logits)).unwrap();
    check(&r[39], &a, "slot 0's prompt");
    b.hold(0, &a, None);
    // another prompt with a's first 36 tokens: two whole blocks are cached
    let mut c = a[..36].to_vec();
    c.extend(&text[100..110]);
    assert_eq!(b.reusable(1, &c, None), 32);
    assert_eq!(b.reuse(1, &c, None), 32);
    assert_eq!(b.kv_pool().table(1), &b.kv_pool().table(0)[..2]);
    // slot 1 prefills from 32 while slot 0 decodes on
    let mut a1 = a.clone();
    a1.push(top1(&cpu_last(&model, &a)));
    let mut step = rows(0, 40, &a1[40..], RowOutput::Logits);
    step.extend(rows(1, 32, &c[32..], RowOutput::Logits));
    let r = b.step(&step).unwrap();
    check(&r[0], &a1, "slot 0 decoding beside the adopter");
    check(r.last().unwrap(), &c, "slot 1 after adopting two blocks");
    // slot 1 rewinds into the second shared block: it gets a copy, slot 0 keeps its own
    let mut d = c[..20].to_vec();
    d.extend(&text[150..155]);
    let mut a2 = a1.clone();
    a2.push(top1(&cpu_last(&model, &a1)));
    let mut step = rows(1, 20, &d[20..], RowOutput::Logits);
    step.extend(rows(0, 41, &a2[41..], RowOutput::Logits));
    let r = b.step(&step).unwrap();
    assert_eq!(b.kv_pool().stats().copies, 1);
    check(
        &r[d.len() - 21],
        &d,
        "slot 1 after a rewind into a shared block",
    );
    check(r.last().unwrap(), &a2, "slot 0 after the other's rewind");

    // a pool of five blocks: slot 0 takes three, slot 1's 40 positions do not fit
    let mut b = gpu.batch_with(2, 64, 64, 80).unwrap();
    b.step(&rows(0, 0, &a, RowOutput::Logits)).unwrap();
    let e = b
        .step(&rows(1, 0, &c[..40], RowOutput::Logits))
        .unwrap_err();
    assert!(e.to_string().contains("KV cache is full"), "{e}");
    assert!(b.reserve(1, 40).is_err());
    let r = b.step(&rows(0, 40, &a1[40..], RowOutput::Logits)).unwrap();
    check(&r[0], &a1, "slot 0 after the other's refused step");
    let r = b.step(&rows(1, 0, &c[..30], RowOutput::Logits)).unwrap();
    check(&r[29], &c[..30], "slot 1 in the room left");
    // a pool that cannot hold one context is refused up front
    let e = gpu
        .batch_with(2, 64, 64, 48)
        .err()
        .expect("too small a pool");
    assert!(e.to_string().contains("cannot hold one context"), "{e}");
}

/// A mask allowing about an eighth of the vocabulary, a function of `seed` and the previous
/// token: what a grammar's next mask is.
fn mask_after(seed: u64, prev: u32, n_vocab: usize) -> TokenMask {
    let mut r = StdRng::seed_from_u64(seed ^ (u64::from(prev) << 24));
    TokenMask::from_allowed((0..n_vocab as u32).filter(|_| r.gen_ratio(1, 8)), n_vocab)
}

/// Masks given after the submit (the step's forward pass running meanwhile, its rows taking
/// the previous step's tokens on the GPU) draw what the same masks given at the submit draw
/// one step at a time; misuse is an error, never a hang.
#[test]
fn late_masks_draw_what_masks_given_at_the_submit_draw() {
    let Some(ctx) = gpu_or_skip("gpu_batch_late_masks") else {
        return;
    };
    let (model, golden) = load(SMOLLM2);
    let gpu = GpuModel::load(&ctx, &model).unwrap();
    let n_vocab = model.config.n_vocab;
    let seed: u64 = rand::random();
    let p: Vec<Vec<u32>> = (0..2)
        .map(|i| {
            golden.greedy[i]
                .prompt_ids
                .iter()
                .take(10 - 3 * i)
                .copied()
                .collect()
        })
        .collect();
    let draw = RowOutput::Sample(Draw::greedy(0));
    let first: Vec<BatchRow> = [0, 1]
        .into_iter()
        .flat_map(|s| rows(s, 0, &p[s as usize], draw))
        .collect();
    let last_rows = [p[0].len() - 1, first.len() - 1];
    let first_masks: Vec<TokenMask> = (0..2)
        .map(|s| mask_after(seed, *p[s].last().unwrap(), n_vocab))
        .collect();
    let decode = |prev: [Option<u32>; 2], k: u32| -> Vec<BatchRow> {
        (0..2u32)
            .map(|s| BatchRow {
                slot: s,
                pos: p[s as usize].len() as u32 + k - 1,
                token: prev[s as usize].map_or(TokenIn::Sampled, TokenIn::Id),
                output: draw,
                adapter: None,
            })
            .collect()
    };
    let steps = 6;

    // masks at the submit, one step at a time
    let mut b = gpu.batch(2, 64, 32).unwrap();
    let mut masks: Vec<Option<&TokenMask>> = vec![None; first.len()];
    masks[last_rows[0]] = Some(&first_masks[0]);
    masks[last_rows[1]] = Some(&first_masks[1]);
    b.submit_masked(&first, &masks).unwrap();
    let r = b.collect().unwrap();
    let mut want = vec![[token_of(&r[last_rows[0]]).0, token_of(&r[last_rows[1]]).0]];
    for s in 0..2 {
        assert!(first_masks[s].allows(want[0][s]), "seed {seed}");
    }
    for k in 1..steps {
        let prev = want[k as usize - 1];
        let m: Vec<TokenMask> = prev.iter().map(|&t| mask_after(seed, t, n_vocab)).collect();
        b.submit_masked(&decode(prev.map(Some), k), &[Some(&m[0]), Some(&m[1])])
            .unwrap();
        let r = b.collect().unwrap();
        let got = [token_of(&r[0]).0, token_of(&r[1]).0];
        assert!(m[0].allows(got[0]) && m[1].allows(got[1]), "seed {seed}");
        want.push(got);
    }

    // late masks, pipelined: step k + 1 is submitted before step k is read
    let mut b = gpu.batch(2, 64, 32).unwrap();
    assert!(
        b.late_masks(),
        "{} has timeline semaphores",
        ctx.caps().name
    );
    let mut late = vec![false; first.len()];
    late[last_rows[0]] = true;
    late[last_rows[1]] = true;
    b.submit_late(&first, &[], &late).unwrap();
    b.give_masks(&[Some(&first_masks[0]), Some(&first_masks[1])])
        .unwrap();
    let mut got = Vec::new();
    for k in 1..=steps {
        if k < steps {
            b.submit_late(&decode([None, None], k), &[], &[true, true])
                .unwrap();
        }
        let r = b.collect().unwrap();
        let at = if k == 1 { last_rows } else { [0, 1] };
        let t = [token_of(&r[at[0]]).0, token_of(&r[at[1]]).0];
        if k < steps {
            let m: Vec<TokenMask> = t.iter().map(|&t| mask_after(seed, t, n_vocab)).collect();
            b.give_masks(&[Some(&m[0]), Some(&m[1])]).unwrap();
        }
        got.push(t);
    }
    assert_eq!(got, want, "seed {seed}");

    // misuse
    let err = |r: Result<(), octoflow_model::error::ModelError>| r.unwrap_err().to_string();
    assert!(err(b.give_masks(&[])).contains("no step waits"));
    let at = p[0].len() as u32 + steps - 1;
    let one = |pos: u32, token| BatchRow {
        slot: 0,
        pos,
        token,
        output: draw,
        adapter: None,
    };
    b.submit_late(&[one(at, TokenIn::Sampled)], &[], &[true])
        .unwrap();
    assert!(err(b.submit_late(&[one(at + 1, TokenIn::Id(1))], &[], &[])).contains("not given"));
    let e = b.collect().unwrap_err().to_string();
    assert!(e.contains("before its late masks"), "{e}");
    b.submit_late(&[one(at + 1, TokenIn::Id(1))], &[], &[true])
        .unwrap();
    assert!(err(b.give_masks(&[None, None])).contains("2 late masks for 1"));
    // the draw went unconstrained; the engine goes on
    b.collect().unwrap();
    b.submit_late(&[one(at + 2, TokenIn::Sampled)], &[], &[true])
        .unwrap();
    b.give_masks(&[Some(&first_masks[0])]).unwrap();
    let r = b.collect().unwrap();
    assert!(first_masks[0].allows(token_of(&r[0]).0), "seed {seed}");
}
