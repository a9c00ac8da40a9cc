//! Whole runs resident on the GPU (`GpuRun`, K steps a submit) against the host interpreter
//! stepping the same GPU batch engine: the same outputs, token for token, on a tiny random
//! model (lavapipe in CI).

use octoflow_agents::{assemble, Event, GpuRun, Pattern, Run, RunConfig};
use octoflow_model::gpu::GpuModel;
use octoflow_model::testing::{rng, tiny_model, TINY};
use octoflow_vk::testing::gpu_or_skip;
use rand::Rng;

const N_CTX: usize = 256;
const MAX_ROWS: usize = 16;
/// The tiny model's vocabulary is 50 ids; id 2 plays the end-of-generation token.
const EOG: u32 = 2;

fn tokenize(s: &str) -> Vec<u32> {
    s.bytes().map(|b| b as u32 % TINY.n_vocab as u32).collect()
}

/// Outputs as (task, round, tokens, finish), sorted: which instance took which task may
/// differ between the host and the GPU (docs/VM.md), so instances are compared only where
/// the program fixes them (`by_instance`).
type Outputs = Vec<(Option<u32>, u32, Option<u32>, Vec<u32>, String)>;

fn collect(events: Vec<Event>, by_instance: bool, out: &mut Outputs) {
    for e in events {
        match e {
            Event::Output {
                instance,
                task,
                round,
                tokens,
                finish,
                ..
            } => out.push((
                task,
                round,
                by_instance.then_some(instance),
                tokens,
                format!("{finish:?}"),
            )),
            Event::Error { message, .. } => panic!("{message}"),
        }
    }
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
    let cases = [
        (Pattern::Queue, 3, 5, false),
        (Pattern::Debate, 3, 2, true),
        (Pattern::Swarm, 3, 2, false),
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
            want.sort();
            drop(engine);

            for steps in [1u32, 5] {
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
                let mut got = Outputs::new();
                let mut submits = 0;
                while !gpu.finished() {
                    let report = gpu.submit().unwrap();
                    collect(report.events, by_instance, &mut got);
                    submits += 1;
                    assert!(submits < 10_000, "{pattern:?} never finished");
                }
                got.sort();
                assert_eq!(
                    got, want,
                    "{pattern:?} at temperature {temperature}, {steps} steps a submit"
                );
                assert!(!got.is_empty());
            }
        }
    }
}
