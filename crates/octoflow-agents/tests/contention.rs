//! Thousands of instances contending for one queue and one mailbox, with random task lengths,
//! generation lengths and rows per step: every task is taken once, every message arrives once
//! and intact, and the arena hands out exactly what was asked.

mod common;

use std::collections::BTreeMap;

use common::*;
use octoflow_agents::{Event, Run, RunConfig};
use octoflow_model::testing::rng;
use rand::rngs::StdRng;
use rand::Rng;

/// A next token mixing the whole context; the end-of-generation token one time in seven.
fn mix(ctx: &[u32]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in ctx {
        h = (h ^ t as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 31;
    match h % 7 {
        0 => EOG,
        _ => (h % 256) as u32,
    }
}

/// What greedy generation of at most `limit` tokens gives after `ctx` on the fake: every
/// token generated, and the kept ones (without a final end-of-generation token).
fn generate(ctx: &[u32], limit: usize) -> (Vec<u32>, Vec<u32>) {
    let mut ctx = ctx.to_vec();
    let mut out = Vec::new();
    loop {
        let t = mix(&ctx);
        out.push(t);
        if t == EOG {
            let kept = out[..out.len() - 1].to_vec();
            return (out, kept);
        }
        if out.len() == limit {
            return (out.clone(), out);
        }
        ctx.push(t);
    }
}

fn random_tasks(rng: &mut StdRng, n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|_| {
            let len = rng.gen_range(1..=6);
            (0..len).map(|_| rng.gen_range(0..256)).collect()
        })
        .collect()
}

fn schedule(rng: &mut StdRng) -> (usize, usize) {
    let max_rows = [7, 64, 512, 4096][rng.gen_range(0..4)];
    let chunk = [1, 3, 16][rng.gen_range(0..3)];
    println!("max_rows = {max_rows}, chunk = {chunk}");
    (max_rows, chunk)
}

/// Stage 1 drains the host tasks (a task-dependent length of 1..5 tokens) and pushes each
/// answer to `work`; instance 0 closes `work` once every answer is in; stage 2 drains `work`
/// and sends each reply to slot `%task` of `res`; instance 0 emits the best reply.
const RELAY: &str = "
.const C \"=>\"
.queue work %tasks
.mailbox pushed %tasks
.mailbox res %tasks
stage1:
    take tasks, stage1_done
    rem r9, %task, 5
    add r9, r9, 1
    reset
    append.task
    gen r9, -
    emit 0
    push work, r1
    send pushed, %task
    jmp stage1
stage1_done:
    bne %id, 0, stage2
    wait pushed, %tasks
    close work
stage2:
    take work, stage2_done
    reset
    append.task
    append.const C
    gen 3, -
    emit 1
    send res, %task
    jmp stage2
stage2_done:
    bne %id, 0, end
    wait res, %tasks
    best res, 0, %tasks
    emit 2
end:
    halt
";

#[test]
fn two_thousand_instances_relay_three_thousand_tasks_through_a_queue_and_a_mailbox() {
    let mut rng = rng("relay");
    let (n, n_tasks) = (2000, 3000);
    let tasks = random_tasks(&mut rng, n_tasks);
    let (max_rows, chunk) = schedule(&mut rng);
    let mut engine = Fake::new(n, 64, max_rows, Box::new(|c: &[u32]| mix(c)));
    let cfg = RunConfig {
        chunk,
        ..config(n, 8)
    };
    let mut run = Run::new(asm(RELAY), cfg, tasks.clone(), &engine).expect("starts");
    let events = finish(&mut run, &mut engine, 1_000_000).expect("finishes");
    assert_eq!(errors(&events), Vec::<String>::new());

    // Stage 1: one answer per task, as greedy generation gives it.
    let mut stage1: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut stage2: BTreeMap<u32, Vec<(Vec<u32>, f32)>> = BTreeMap::new();
    let mut best = Vec::new();
    for e in &events {
        if let Event::Output {
            task: Some(task),
            round,
            tokens,
            score,
            ..
        } = e
        {
            match round {
                0 => assert!(
                    stage1.insert(*task, tokens.clone()).is_none(),
                    "task {task} twice"
                ),
                1 => stage2
                    .entry(*task)
                    .or_default()
                    .push((tokens.clone(), *score)),
                _ => best.push((tokens.clone(), *score)),
            }
        }
    }
    assert_eq!(stage1.len(), n_tasks);
    assert_eq!(stage2.len(), n_tasks);
    let mut gen_tokens = 0;
    for (t, task) in tasks.iter().enumerate() {
        let limit = t % 5 + 1;
        gen_tokens += limit + 3;
        let (_, kept) = generate(task, limit);
        assert_eq!(stage1[&(t as u32)], kept, "task {t}, stage 1");
        // Stage 2 read the pushed span back: intact only if no allocation overlapped it.
        let replies = &stage2[&(t as u32)];
        assert_eq!(
            replies.len(),
            1,
            "task {t}'s work item taken {} times",
            replies.len()
        );
        let mut ctx = kept.clone();
        ctx.extend(bytes("=>"));
        assert_eq!(replies[0].0, generate(&ctx, 3).1, "task {t}, stage 2");
    }
    // The best reply: the highest score of all.
    let top = stage2
        .values()
        .map(|r| r[0].1)
        .fold(f32::NEG_INFINITY, f32::max);
    assert_eq!(best.len(), 1);
    assert_eq!(best[0].1, top);
    // Every `gen` took exactly its limit, on top of the constant and the tasks.
    let placed: usize = 2 + tasks.iter().map(Vec::len).sum::<usize>();
    assert_eq!(run.arena_used(), placed + gen_tokens);
}

/// Instance `i` answers task `i` (1..7 tokens), sends the answer to slot `i`, waits for all
/// `%n` answers and continues from instance `i + 1`'s.
const RING: &str = "
.mailbox m %n
    task %id
    rem r9, %id, 7
    add r9, r9, 1
    append.task
    gen r9, -
    send m, %id
    emit 0
    add r1, %id, 1
    rem r1, r1, %n
    wait m, %n
    append.msg m, r1
    gen 2, -
    emit 1
    halt
";

#[test]
fn two_thousand_instances_each_read_their_neighbours_message() {
    let mut rng = rng("ring");
    let n = 2000;
    let tasks = random_tasks(&mut rng, n);
    let (max_rows, chunk) = schedule(&mut rng);
    let mut engine = Fake::new(n, 64, max_rows, Box::new(|c: &[u32]| mix(c)));
    let cfg = RunConfig {
        chunk,
        ..config(n, 8)
    };
    let mut run = Run::new(asm(RING), cfg, tasks.clone(), &engine).expect("starts");
    let events = finish(&mut run, &mut engine, 1_000_000).expect("finishes");
    assert_eq!(errors(&events), Vec::<String>::new());

    let first: Vec<(Vec<u32>, Vec<u32>)> = (0..n).map(|i| generate(&tasks[i], i % 7 + 1)).collect();
    let mut seen = vec![0; n];
    for (instance, _, round, tokens) in outputs(&events) {
        let i = instance as usize;
        if round == 0 {
            assert_eq!(tokens, first[i].1, "instance {i}'s answer");
            continue;
        }
        seen[i] += 1;
        // Its context: the task, every generated token (the last fed by the append), then
        // the neighbour's kept answer.
        let mut ctx = tasks[i].clone();
        ctx.extend(&first[i].0);
        ctx.extend(&first[(i + 1) % n].1);
        assert_eq!(tokens, generate(&ctx, 2).1, "instance {i}'s reply");
    }
    assert!(seen.iter().all(|&s| s == 1), "every instance replied once");
}
