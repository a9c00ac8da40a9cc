//! The shipped programs finish (no deadlock, no runtime error) for several instance, task and
//! round counts, emit what their contract says, and give the same transcripts whatever the
//! rows per step.

mod common;

use common::*;
use octoflow_agents::{assemble, Pattern, Run, RunConfig};

/// A next token mixing the whole context: letters, with a newline about one time in five and
/// the end-of-generation token one time in thirteen.
fn chatter() -> Next {
    Box::new(|ctx: &[u32]| {
        let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
        for &t in ctx {
            h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h ^= h >> 29;
        match h % 65 {
            0..=12 => b'\n' as u32,
            13..=17 => EOG,
            x => b'a' as u32 + (x % 26) as u32,
        }
    })
}

fn tasks(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| bytes(&format!("task {i}: what is {} + {}?", i * 7, i + 3)))
        .collect()
}

/// An output: (task, round, instance, tokens).
type Output = (Option<u32>, u32, u32, Vec<u32>);

/// Runs `pattern`; returns its outputs, sorted.
fn run_pattern(
    pattern: Pattern,
    instances: usize,
    n_tasks: usize,
    rounds: u32,
    max_rows: usize,
    chunk: usize,
) -> Vec<Output> {
    let mut engine = Fake::new(instances, 4096, max_rows, chatter());
    let program = assemble(pattern.source(), &bytes).expect("assembles");
    let cfg = RunConfig {
        rounds,
        chunk,
        temperature: 0.7,
        top_k: 20,
        ..config(instances, 12)
    };
    let mut run = Run::new(program, cfg, tasks(n_tasks), &engine).expect("starts");
    let events = finish(&mut run, &mut engine, 1_000_000)
        .unwrap_or_else(|e| panic!("{pattern} n={instances} tasks={n_tasks}: {e}"));
    assert_eq!(
        errors(&events),
        Vec::<String>::new(),
        "{pattern} n={instances} tasks={n_tasks}"
    );
    let mut out: Vec<Output> = outputs(&events)
        .into_iter()
        .map(|(instance, task, round, tokens)| (task, round, instance, tokens))
        .collect();
    out.sort();
    out
}

/// (task, round, instance) of each output.
fn keys(out: &[Output]) -> Vec<(Option<u32>, u32, u32)> {
    out.iter().map(|o| (o.0, o.1, o.2)).collect()
}

const SHAPES: [(usize, usize); 7] = [(1, 0), (1, 3), (2, 1), (2, 4), (3, 4), (8, 1), (8, 5)];

#[test]
fn queue_answers_every_task_once() {
    for (n, t) in SHAPES {
        let out = run_pattern(Pattern::Queue, n, t, 1, 64, 16);
        let got: Vec<_> = out.iter().map(|o| (o.0, o.1)).collect();
        let want: Vec<_> = (0..t as u32).map(|i| (Some(i), 0)).collect();
        assert_eq!(got, want, "n={n} tasks={t}");
    }
}

#[test]
fn best_of_has_instance_zero_answer_every_task_once() {
    for (n, t) in SHAPES {
        let out = run_pattern(Pattern::BestOf, n, t, 1, 64, 16);
        let want: Vec<_> = (0..t as u32).map(|i| (Some(i), 0, 0)).collect();
        assert_eq!(keys(&out), want, "n={n} tasks={t}");
    }
}

#[test]
fn debate_emits_every_instance_every_round_of_every_task() {
    for (n, t) in SHAPES {
        for rounds in [1, 2, 3] {
            let out = run_pattern(Pattern::Debate, n, t, rounds, 64, 16);
            let mut want = Vec::new();
            for task in 0..t as u32 {
                for round in 0..rounds {
                    for i in 0..n as u32 {
                        want.push((Some(task), round, i));
                    }
                }
            }
            assert_eq!(keys(&out), want, "n={n} tasks={t} rounds={rounds}");
        }
    }
}

#[test]
fn swarm_answers_every_task_once_and_each_sub_question_by_a_worker() {
    for (n, t) in SHAPES {
        let out = run_pattern(Pattern::Swarm, n, t, 1, 64, 16);
        let finals: Vec<_> = keys(&out).into_iter().filter(|k| k.1 == 0).collect();
        let want: Vec<_> = (0..t as u32).map(|i| (Some(i), 0, 0)).collect();
        assert_eq!(finals, want, "n={n} tasks={t}");
        let subs: Vec<_> = keys(&out).into_iter().filter(|k| k.1 == 1).collect();
        assert!(subs.iter().all(|k| k.2 != 0 && k.0.is_some()), "{subs:?}");
        if n == 1 {
            assert!(subs.is_empty(), "alone, the coordinator answers directly");
        }
        assert!(
            subs.len() <= t * (n - 1),
            "at most one sub-question per worker and task"
        );
    }
}

#[test]
fn the_swarm_coordinator_reads_its_workers_answers() {
    // One task, three instances: the coordinator's context ends with each worker's answer
    // after the constant that introduces it.
    let mut engine = Fake::new(3, 4096, 64, chatter());
    let program = assemble(Pattern::Swarm.source(), &bytes).expect("assembles");
    let mut run = Run::new(program, config(3, 12), tasks(1), &engine).expect("starts");
    let events = finish(&mut run, &mut engine, 100_000).expect("finishes");
    let answers: Vec<Vec<u32>> = outputs(&events)
        .into_iter()
        .filter(|o| o.2 == 1)
        .map(|o| o.3)
        .collect();
    assert!(
        !answers.is_empty(),
        "the chatter gives at least one sub-question"
    );
    let coordinator = &engine.slots[0];
    for a in &answers {
        let mut needle = bytes("\n\nAn answer to one of the sub-questions: ");
        needle.extend_from_slice(a);
        assert!(
            coordinator.windows(needle.len()).any(|w| w == needle),
            "answer {a:?} not in the coordinator's context"
        );
    }
}

#[test]
fn transcripts_do_not_depend_on_the_rows_per_step() {
    for pattern in Pattern::ALL {
        for (n, t) in [(3, 4), (8, 5)] {
            let wide = run_pattern(pattern, n, t, 2, 4096, 4096);
            for (max_rows, chunk) in [(1, 1), (3, 2), (17, 5)] {
                let narrow = run_pattern(pattern, n, t, 2, max_rows, chunk);
                // Queue and swarm hand tasks to whichever instance takes them first: compare
                // by task and round there.
                let strip = |v: &[Output]| {
                    let mut v: Vec<_> = v.iter().map(|o| (o.0, o.1, o.3.clone())).collect();
                    v.sort();
                    v
                };
                match pattern {
                    Pattern::Queue | Pattern::Swarm => assert_eq!(strip(&wide), strip(&narrow)),
                    _ => assert_eq!(wide, narrow, "{pattern} max_rows={max_rows}"),
                }
            }
        }
    }
}
