//! Warm-up (`GpuBatch::warm_up`, `GpuSession::warm_up`): after it, the steps a server or a
//! generation runs build no pipeline, and their results are those of an engine that never
//! warmed up (tiny random llama model).

use octoflow_vk::testing::gpu_or_skip;
use rand::rngs::StdRng;
use rand::Rng;

use octoflow_core::Draw;

use crate::gpu::GpuModel;
use crate::testing::{rng, tiny_model, TINY};
use crate::{BatchForward, BatchRow, Forward, Logits, RowOutput, TokenIn};

const SLOTS: usize = 4;
const N_CTX: usize = 96;
const MAX_ROWS: usize = 40;

fn greedy() -> Draw {
    Draw::greedy(0)
}

/// Steps like the scheduler's: each slot's prompt in chunks of any length, the rows of the
/// sequences already prefilled as decode rows before them, one sampled or logits row per
/// sequence whose prompt ends or which decodes. Returns the rows of every step.
fn scheduled_steps(rng: &mut StdRng, n_vocab: u32) -> Vec<Vec<BatchRow>> {
    let prompts: Vec<usize> = (0..SLOTS)
        .map(|_| rng.gen_range(1..=MAX_ROWS + 8))
        .collect();
    let mut fed = [0usize; SLOTS];
    let mut steps = Vec::new();
    for _ in 0..12 {
        let mut rows = Vec::new();
        for (slot, &len) in prompts.iter().enumerate() {
            if fed[slot] >= len && fed[slot] < N_CTX && rows.len() < MAX_ROWS {
                let output = if rng.gen_bool(0.5) {
                    RowOutput::Sample(greedy())
                } else {
                    RowOutput::Logits
                };
                let token = TokenIn::Id(rng.gen_range(0..n_vocab));
                let pos = fed[slot] as u32;
                rows.push((slot, pos, token, output));
                fed[slot] += 1;
            }
        }
        for (slot, &len) in prompts.iter().enumerate() {
            let room = MAX_ROWS - rows.len();
            let take = rng
                .gen_range(1..=MAX_ROWS)
                .min(room)
                .min(len.saturating_sub(fed[slot]));
            for _ in 0..take {
                let last = fed[slot] + 1 == len;
                let output = if last {
                    RowOutput::Logits
                } else {
                    RowOutput::None
                };
                let token = TokenIn::Id(rng.gen_range(0..n_vocab));
                rows.push((slot, fed[slot] as u32, token, output));
                fed[slot] += 1;
            }
        }
        if rows.is_empty() {
            break;
        }
        steps.push(
            rows.into_iter()
                .map(|(slot, pos, token, output)| BatchRow {
                    slot: slot as u32,
                    pos,
                    token,
                    output,
                    adapter: None,
                })
                .collect(),
        );
    }
    steps
}

#[test]
fn after_a_batch_warm_up_no_step_builds_a_pipeline_and_results_are_unchanged() {
    let Some(ctx) = gpu_or_skip("batch_warm_up") else {
        return;
    };
    let mut r = rng("batch_warm_up");
    let model = tiny_model("llama", TINY, &mut r);
    let gm = GpuModel::load(&ctx, &model).unwrap();
    let mut warm = gm.batch(SLOTS, N_CTX, MAX_ROWS).unwrap();
    let recorded = warm.warm_up().unwrap();
    assert!(recorded > 0, "a fresh engine records its chains");
    assert_eq!(
        warm.warm_up().unwrap(),
        0,
        "a second warm-up records nothing"
    );
    let built = ctx.pipelines_built();
    let steps = scheduled_steps(&mut r, TINY.n_vocab as u32);
    let mut warm_out = Vec::new();
    for rows in &steps {
        warm_out.push(warm.step(rows).unwrap());
    }
    assert_eq!(
        ctx.pipelines_built(),
        built,
        "a step after the warm-up built a pipeline (steps: {:?})",
        steps.iter().map(Vec::len).collect::<Vec<_>>()
    );
    drop(warm);
    // an engine that never warmed up gives the same results
    let mut cold = gm.batch(SLOTS, N_CTX, MAX_ROWS).unwrap();
    for (i, rows) in steps.iter().enumerate() {
        assert_eq!(cold.step(rows).unwrap(), warm_out[i], "step {i}");
    }
}

#[test]
fn after_a_session_warm_up_a_prompt_and_its_decode_steps_build_no_pipeline() {
    let Some(ctx) = gpu_or_skip("session_warm_up") else {
        return;
    };
    let mut r = rng("session_warm_up");
    let model = tiny_model("llama", TINY, &mut r);
    let gm = GpuModel::load(&ctx, &model).unwrap();
    let prompt: Vec<u32> = (0..r.gen_range(9..40))
        .map(|_| r.gen_range(0..TINY.n_vocab as u32))
        .collect();
    let run = |warm: bool| {
        let mut s = gm.session(N_CTX, 4).unwrap();
        if warm {
            assert_eq!(s.warm_up(Some(&greedy()), usize::MAX).unwrap(), 2);
        }
        let built = ctx.pipelines_built();
        let logits = s.forward(&prompt, 0, Logits::Last).unwrap();
        let steps = s.decode_steps(7, &greedy(), 8, &[]).unwrap();
        (ctx.pipelines_built() - built, logits, steps.tokens)
    };
    let (built, logits, tokens) = run(true);
    assert_eq!(built, 0, "a {}-token prompt built pipelines", prompt.len());
    let (_, cold_logits, cold_tokens) = run(false);
    assert_eq!((logits, tokens), (cold_logits, cold_tokens));
}
