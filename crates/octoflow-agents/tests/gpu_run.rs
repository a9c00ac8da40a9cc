//! Whole runs resident on the GPU (`GpuRun`, K steps a submit) against the host interpreter
//! stepping the same GPU batch engine: the same outputs, token for token, on a tiny random
//! model (lavapipe in CI), and the same scores within a bound.

mod common;

use octoflow_agents::{assemble, AgentError, Event, GpuRun, Pattern, Run, RunConfig};
use octoflow_model::gpu::GpuModel;
use octoflow_model::testing::{rng, tiny_model, TINY};
use octoflow_vk::testing::gpu_or_skip;
use rand::Rng;

const N_CTX: usize = 256;
const MAX_ROWS: usize = 16;
/// The tiny model's vocabulary is 50 ids; id 2 plays the end-of-generation token.
const EOG: u32 = 2;
/// Scores' relative bound, GPU against host, where both run the same product kernels. Both
/// sum the same sampler's log-probabilities in the same order with f32 adds (exact in Vulkan);
/// only the mean's division may differ, by at most 2.5 ulp in Vulkan (3e-7 relative): 1e-6
/// leaves a margin and nothing more.
const SCORE_REL: f32 = 1e-6;
/// The bound where the GPU run's products take cooperative matrices and the host's small steps
/// the matvec: `GpuRun` records its forward at `MAX_ROWS` rows, the host's steps run the
/// batch engine's chain for their own row count, so the logits differ by the f16 rounding of
/// the cooperative products' operands (the tokens stay equal; measured 6.7e-6 on an H100 and
/// 6.4e-4 on an H200 with seed 9189949877528761736, which lavapipe's plain products pass at
/// 1e-6): 2e-3.
const SCORE_REL_COOP: f32 = 2e-3;

fn tokenize(s: &str) -> Vec<u32> {
    s.bytes().map(|b| b as u32 % TINY.n_vocab as u32).collect()
}

/// Outputs as (task, round, instance, tokens, finish), sorted, each with its score: which
/// instance took which task may differ between the host and the GPU (docs/VM.md), so
/// instances are compared only where the program fixes them (`by_instance`).
type Outputs = Vec<((Option<u32>, u32, Option<u32>, Vec<u32>, String), f32)>;

fn collect(events: Vec<Event>, by_instance: bool, out: &mut Outputs) {
    for e in events {
        match e {
            Event::Output {
                instance,
                task,
                round,
                tokens,
                finish,
                score,
            } => out.push((
                (
                    task,
                    round,
                    by_instance.then_some(instance),
                    tokens,
                    format!("{finish:?}"),
                ),
                score,
            )),
            Event::Error { message, .. } => panic!("{message}"),
        }
    }
}

/// The same outputs (for `best-of`: the same winners), and scores within `rel` — a
/// score is never NaN now that the sampler gives log-probabilities.
fn assert_same(got: &Outputs, want: &Outputs, what: &str, rel: f32) {
    let keys = |o: &Outputs| o.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(got), keys(want), "{what}");
    for ((k, g), (_, w)) in got.iter().zip(want) {
        assert!(
            !w.is_nan() && !g.is_nan(),
            "{what}: {k:?} scores {g} vs host {w}"
        );
        let close = g == w || (g - w).abs() <= rel * w.abs();
        assert!(close, "{what}: {k:?} scores {g} vs host {w}");
    }
}

/// `best-of` on the GPU: each task's output is the answer of the highest score among the
/// task's slots of `answers` as the GPU left them (ties: the lowest slot), the host's rule.
fn winners_are_the_best_scored(run: &Run, outputs: &Outputs, n: usize) {
    let mem = run.memory();
    let answers = &mem.mailboxes[0];
    let mut not_first = 0;
    for ((task, _, _, tokens, _), score) in outputs {
        let t = task.expect("best-of outputs name their task") as usize;
        let slots: Vec<_> = (t * n..(t + 1) * n)
            .map(|slot| answers.read(slot as u32, u64::MAX).expect("an answer").span)
            .collect();
        let mut best = 0;
        for (i, s) in slots.iter().enumerate() {
            assert!(!s.score.is_nan(), "task {t}: slot {i} scores NaN");
            if s.score > slots[best].score {
                best = i;
            }
        }
        let w = &slots[best];
        assert_eq!(
            score.to_bits(),
            w.score.to_bits(),
            "task {t}: the winner's score"
        );
        assert_eq!(
            tokens,
            mem.arena.get(w.offset, w.len),
            "task {t}: the winner's tokens"
        );
        not_first += usize::from(best != 0);
    }
    println!(
        "best-of: {not_first} of {} winners past the first slot",
        outputs.len()
    );
}

fn config(instances: usize, temperature: f32) -> RunConfig {
    RunConfig {
        instances,
        max_tokens: 12,
        rounds: 2,
        seed: 11,
        temperature,
        top_k: 20,
        top_p: 0.9,
        min_p: 0.0,
        eog: vec![EOG],
        chunk: 8,
        arena_tokens: 1 << 14,
        device_sampling: true,
    }
}

#[test]
fn a_run_on_the_gpu_gives_the_host_interpreters_outputs() {
    let Some(ctx) = gpu_or_skip("gpu_run") else {
        return;
    };
    let mut r = rng("gpu_run");
    let model = tiny_model("llama", TINY, &mut r);
    let gm = GpuModel::load(&ctx, &model).unwrap();
    let rel = if gm.kernels().linear.uses_coop(MAX_ROWS as u32) {
        SCORE_REL_COOP
    } else {
        SCORE_REL
    };
    let cases = [
        (Pattern::Queue, 3, 5, false),
        (Pattern::Debate, 3, 2, true),
        (Pattern::Swarm, 3, 2, false),
        // The winner of each task is picked by mean log-probability on the GPU.
        (Pattern::BestOf, 3, 2, true),
    ];
    for (pattern, instances, n_tasks, by_instance) in cases {
        for temperature in [0.0, 0.8] {
            let tasks: Vec<Vec<u32>> = (0..n_tasks)
                .map(|_| {
                    (0..r.gen_range(2..=9))
                        .map(|_| r.gen_range(3..TINY.n_vocab as u32))
                        .collect()
                })
                .collect();
            let program = assemble(pattern.source(), &tokenize).unwrap();
            let cfg = config(instances, temperature);

            let mut engine = gm.batch(instances, N_CTX, MAX_ROWS).unwrap();
            let mut host = Run::new(program.clone(), cfg.clone(), tasks.clone(), &engine).unwrap();
            host.set_device_sampling(true);
            let mut want = Outputs::new();
            while !host.finished() {
                host.step(&mut engine).unwrap();
                collect(host.events(), by_instance, &mut want);
            }
            want.sort_by(|a, b| a.0.cmp(&b.0));
            drop(engine);

            // 1 and 5 steps a chain; then 5 with a one-token outbox, so every chain's
            // outputs stay in the arena and the host reads them there
            for (steps, outbox) in [(1u32, None), (5, None), (5, Some(1))] {
                let mut gpu = GpuRun::new(
                    &gm,
                    program.clone(),
                    cfg.clone(),
                    tasks.clone(),
                    N_CTX,
                    MAX_ROWS,
                    steps,
                )
                .unwrap();
                if let Some(tokens) = outbox {
                    gpu.set_outbox_tokens(tokens).unwrap();
                }
                let mut got = Outputs::new();
                let mut submits = 0;
                while !gpu.finished() {
                    let report = gpu.submit().unwrap();
                    collect(report.events, by_instance, &mut got);
                    submits += 1;
                    assert!(submits < 10_000, "{pattern:?} never finished");
                }
                if pattern == Pattern::BestOf {
                    winners_are_the_best_scored(gpu.run(), &got, instances);
                }
                got.sort_by(|a, b| a.0.cmp(&b.0));
                let what = format!(
                    "{pattern:?} at temperature {temperature}, {steps} steps a submit, outbox {outbox:?}"
                );
                assert_same(&got, &want, &what, rel);
                assert!(!got.is_empty());
            }
        }
    }
}

/// A run whose every live instance waits for what cannot come ends the GPU run with the host
/// interpreter's deadlock report (the state read back whole from the GPU), and submits stop.
#[test]
fn a_stalled_run_on_the_gpu_reports_the_hosts_deadlock() {
    let Some(ctx) = gpu_or_skip("gpu_run_deadlock") else {
        return;
    };
    let mut r = rng("gpu_run_deadlock");
    let model = tiny_model("llama", TINY, &mut r);
    let gm = GpuModel::load(&ctx, &model).unwrap();
    let program = assemble(common::STALL_SRC, &tokenize).unwrap();
    let cfg = config(2, 0.0);
    let mut engine = gm.batch(2, N_CTX, MAX_ROWS).unwrap();
    let mut host = Run::new(program.clone(), cfg.clone(), vec![], &engine).unwrap();
    let want = loop {
        if let Err(e) = host.step(&mut engine) {
            break e.to_string();
        }
        assert!(host.steps() < 100, "the host never stalled");
    };
    drop(engine);
    let mut gpu = GpuRun::new(&gm, program, cfg, vec![], N_CTX, MAX_ROWS, 3).unwrap();
    let err = loop {
        match gpu.submit() {
            Ok(report) => assert!(report.events.is_empty(), "{:?}", report.events),
            Err(e) => break e,
        }
        assert!(gpu.submits() < 100, "the GPU run never stalled");
    };
    assert!(matches!(err, AgentError::Deadlock(_)), "{err}");
    assert_eq!(err.to_string(), want);
    assert!(gpu.finished());
    assert!(
        gpu.submit().is_err(),
        "a finished run takes no more submits"
    );
}
