//! Mailboxes, queues, visibility, runtime errors and deadlocks (docs/VM.md, "Memory", "A
//! step"), on the scripted engine.

mod common;

use common::*;
use octoflow_agents::{AgentError, Event, Run, RunConfig, StartError, Status};

#[test]
fn a_message_sent_in_a_step_is_seen_by_wait_in_the_next() {
    let src = "
.mailbox m 1
    bne %id, 0, reader
    task 0
    append.task
    gen 1, -
    send m, 0
    halt
reader:
    wait m, 1
    append.msg m, 0
    gen 1, -
    emit 0
    halt
";
    let mut engine = Fake::new(2, 64, 64, successor());
    let mut run = Run::new(asm(src), config(2, 4), vec![vec![10]], &engine).unwrap();
    let wait_pc = 6;
    run.step(&mut engine).unwrap(); // 0: instance 0 feeds its task
    run.step(&mut engine).unwrap(); // 1: instance 0 generates from the presample and sends
    assert_eq!(run.instance(0).map(|i| i.status), Some(Status::Halted));
    let reader = run.instance(1).cloned().unwrap();
    assert_eq!((reader.status, reader.pc), (Status::Wait, wait_pc));
    run.step(&mut engine).unwrap(); // 2: the message is visible
    assert!(run.instance(1).is_some_and(|i| i.pc > wait_pc));
    let events = finish(&mut run, &mut engine, 100).unwrap();
    assert_eq!(outputs(&events), vec![(1, None, 0, vec![12])]);
}

#[test]
fn a_slot_written_in_this_step_reads_as_empty() {
    let src = "
.mailbox m 1
    task 0
    append.task
    gen 1, -
    bne %id, 0, read
    send m, 0
    halt
read:
    append.msg m, 0
    halt
";
    let mut engine = Fake::new(2, 64, 64, successor());
    let events = run_src(src, config(2, 4), vec![vec![10]], &mut engine).unwrap();
    assert_eq!(
        errors(&events),
        vec!["instance 1, pc 6 (line 10: `append.msg m, 0`): slot 0 of mailbox `m` is empty"]
    );
}

#[test]
fn writing_a_slot_twice_fails_the_second_writer_only() {
    let src = "
.mailbox m 2
    task 0
    append.task
    gen 1, -
    send m, 0
    emit 0
    halt
";
    let mut engine = Fake::new(2, 64, 64, successor());
    let events = run_src(src, config(2, 4), vec![vec![10]], &mut engine).unwrap();
    assert_eq!(
        errors(&events),
        vec!["instance 1, pc 3 (line 6: `send m, 0`): slot 0 of mailbox `m` is already full"]
    );
    assert_eq!(outputs(&events), vec![(0, Some(0), 0, vec![11])]);
}

#[test]
fn runtime_errors_name_the_pc_the_line_and_the_reason() {
    let cases: &[(&str, &str)] = &[
        (
            "div r1, 5, r0\nhalt",
            "instance 0, pc 0 (line 1: `div r1, 5, r0`): division by zero",
        ),
        (
            "rem r1, 5, %finish\nhalt",
            "instance 0, pc 0 (line 1: `rem r1, 5, %finish`): division by zero",
        ),
        (
            "loop: add r0, r0, 1\n jmp loop",
            "instance 0, pc 0 (line 1: `add r0, r0, 1`): no progress: 4096 instructions ran without \
             feeding, generating or waiting",
        ),
        (
            "task 7\nhalt",
            "instance 0, pc 0 (line 1: `task 7`): task 7 does not exist (1 host tasks)",
        ),
        (
            "append.task\nhalt",
            "instance 0, pc 0 (line 1: `append.task`): no current task (no `take` or `task` ran yet)",
        ),
        (
            "emit 0\nhalt",
            "instance 0, pc 0 (line 1: `emit 0`): no last span (no `gen` or `best` ran yet)",
        ),
        (
            "gen 3, -\nhalt",
            "instance 0, pc 0 (line 1: `gen 3, -`): nothing to generate from (no presample and no \
             pending token; append something first)",
        ),
        (
            ".mailbox m %n\nset r1, 1\nwait m, 2\nhalt",
            "instance 0, pc 1 (line 3: `wait m, 2`): waits for 2 messages but mailbox `m` holds at most 1",
        ),
        (
            ".mailbox m %n\nset r1, 1\nbest m, r1, r1\nhalt",
            "instance 0, pc 1 (line 3: `best m, r1, r1`): `best` over the empty slot range 1..1 of mailbox `m`",
        ),
        (
            ".mailbox m %n\nbest m, 0, 1\nhalt",
            "instance 0, pc 0 (line 2: `best m, 0, 1`): slot 0 of mailbox `m` is empty",
        ),
        (
            ".mailbox m %n\ntask 0\nappend.task\ngen 1, -\nsend m, %n\nhalt",
            "instance 0, pc 3 (line 5: `send m, %n`): slot 1 is past mailbox `m`'s capacity of 1",
        ),
        (
            ".queue q %n\ntask 0\nappend.task\ngen 1, -\npush q, r0\npush q, r0\nhalt",
            "instance 0, pc 4 (line 6: `push q, r0`): queue `q` is full (1 tasks)",
        ),
        (
            ".queue q 4\ntask 0\nappend.task\ngen 1, -\nclose q\npush q, r0\nhalt",
            "instance 0, pc 4 (line 6: `push q, r0`): queue `q` is closed",
        ),
        (
            "task 0\nappend.task\ngen 1, -\npush tasks, r0\nhalt",
            "instance 0, pc 3 (line 4: `push tasks, r0`): queue `tasks` is closed",
        ),
    ];
    for &(src, want) in cases {
        let mut engine = Fake::new(1, 64, 64, successor());
        let events = run_src(src, config(1, 4), vec![vec![10]], &mut engine)
            .unwrap_or_else(|e| panic!("{src}: {e}"));
        assert_eq!(errors(&events), vec![want.to_string()], "{src}");
    }
}

#[test]
fn an_exhausted_arena_is_a_runtime_error() {
    let src = "task 0\nappend.task\ngen 5, -\nhalt";
    let mut engine = Fake::new(1, 64, 64, successor());
    let cfg = RunConfig {
        arena_tokens: 8,
        ..config(1, 8)
    };
    let events = run_src(src, cfg, vec![vec![1, 2, 3, 4]], &mut engine).unwrap();
    assert_eq!(
        errors(&events),
        vec![
            "instance 0, pc 2 (line 3: `gen 5, -`): arena full: 5 more tokens asked, 4 of 8 taken"
        ]
    );
}

#[test]
fn a_run_where_every_live_instance_waits_fails_with_a_deadlock_naming_each() {
    let mut engine = Fake::new(3, 64, 64, successor());
    let mut run = Run::new(asm(STALL_SRC), config(2, 4), vec![], &engine).unwrap();
    let err = finish(&mut run, &mut engine, 10).unwrap_err();
    assert!(matches!(err, AgentError::Deadlock(_)));
    assert_eq!(
        err.to_string(),
        "deadlock: every live instance waits for something that cannot come: instance 0 at pc 1 \
         (line 5: `wait m, 1`): mailbox `m` holds 0 of 1 messages; instance 1 at pc 3 (line 8: \
         `take q, done`): queue `q` is open and empty (0 pushed, 0 taken)"
    );
    assert_eq!(
        run.steps(),
        2,
        "found on the first step in which nothing happened"
    );
}

#[test]
fn take_on_an_open_empty_queue_waits_and_a_close_ends_it() {
    let src = "
.queue q 4
    bne %id, 0, consumer
    task 0
    append.task
    gen 2, -
    push q, r1
    close q
    halt
consumer:
    take q, done
    append.task
    gen 2, -
    emit 0
    jmp consumer
done:
    halt
";
    let mut engine = Fake::new(2, 64, 64, successor());
    let mut run = Run::new(asm(src), config(2, 4), vec![vec![10]], &engine).unwrap();
    for _ in 0..3 {
        run.step(&mut engine).unwrap();
        assert_eq!(run.instance(1).map(|i| i.status), Some(Status::Wait));
    }
    let events = finish(&mut run, &mut engine, 100).unwrap();
    // The pushed task is instance 0's span [11, 12], descending from host task 0.
    assert_eq!(outputs(&events), vec![(1, Some(0), 0, vec![13, 14])]);
    assert_eq!(run.instance(1).map(|i| i.status), Some(Status::Halted));
    assert_eq!(run.instance(1).map(|i| i.task), Some(0));
}

/// Three instances answer tasks 10, 20, 30 and emit (round 1); instance 0 emits the `best` of
/// slots `lo..3` (round 0).
fn best_run(peak: fn(u32) -> f32, base: fn(usize) -> f32, lo: u32) -> Vec<Event> {
    let src = format!(
        "
.mailbox m %n
    task %id
    append.task
    gen 3, -
    send m, %id
    emit 1
    bne %id, 0, out
    wait m, %n
    best m, {lo}, %n
    emit 0
out:
    halt
"
    );
    let mut engine = Fake::new(3, 64, 64, successor());
    engine.peak = peak;
    engine.base = base;
    run_src(
        &src,
        config(3, 3),
        vec![vec![10], vec![20], vec![30]],
        &mut engine,
    )
    .unwrap()
}

fn score_of(events: &[Event], instance: u32, round: u32) -> (Vec<u32>, f32) {
    events
        .iter()
        .find_map(|e| match e {
            Event::Output {
                instance: i,
                round: r,
                tokens,
                score,
                ..
            } if *i == instance && *r == round => Some((tokens.clone(), *score)),
            _ => None,
        })
        .expect("the output")
}

#[test]
fn best_keeps_the_highest_score() {
    // Task 20's tokens (21, 22, 23) have the highest peaks.
    let events = best_run(
        |t| if (20..30).contains(&t) { 5.0 } else { 2.0 },
        |_| 0.0,
        0,
    );
    let scores: Vec<f32> = (0..3).map(|i| score_of(&events, i, 1).1).collect();
    assert!(scores[1] > scores[0] && scores[1] > scores[2], "{scores:?}");
    assert_eq!(score_of(&events, 0, 0), score_of(&events, 1, 1));
}

#[test]
fn best_breaks_ties_by_the_lowest_slot() {
    let events = best_run(|_| 3.0, |_| 0.0, 1);
    let scores: Vec<f32> = (0..3).map(|i| score_of(&events, i, 1).1).collect();
    assert!(scores.iter().all(|&s| s == scores[0]), "{scores:?}");
    assert_eq!(score_of(&events, 0, 0).0, vec![21, 22, 23]);
}

#[test]
fn the_task_specials_before_any_task() {
    let src = "set r0, %task\nset r1, %parent\nset r2, %tasks\nset r3, %n\nset r4, %max\nset r5, %rounds\nset r6, %len\nset r7, %pos\nset r8, %id\nhalt";
    let engine = Fake::new(2, 64, 64, successor());
    let cfg = RunConfig {
        rounds: 3,
        ..config(2, 7)
    };
    let mut run = Run::new(asm(src), cfg, vec![vec![1], vec![2]], &engine).unwrap();
    let mut engine = engine;
    finish(&mut run, &mut engine, 10).unwrap();
    let regs = run.instance(1).map(|i| i.regs).unwrap_or_default();
    assert_eq!(&regs[..9], &[u32::MAX, u32::MAX, 2, 2, 7, 3, 0, 0, 1]);
}

#[test]
fn a_run_that_cannot_start_says_why() {
    let engine = Fake::new(2, 64, 64, successor());
    let p = || asm(".mailbox m %tasks*%n*4294967295\n.const c \"hi\"\nhalt");
    let start = |cfg: RunConfig, tasks: Vec<Vec<u32>>| {
        Run::new(p(), cfg, tasks, &engine)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(
        start(config(3, 4), vec![]),
        Some("3 instances need as many KV slots, but the engine holds 2".into())
    );
    assert_eq!(
        start(config(0, 4), vec![]),
        Some("a run needs at least one instance".into())
    );
    assert_eq!(
        start(config(1, 0), vec![]),
        Some("max_tokens must be at least 1".into())
    );
    assert_eq!(
        start(config(1, 4), vec![vec![1], vec![999]]),
        Some("task 1 has token id 999, outside the vocabulary (n_vocab = 260)".into())
    );
    // 1 * 1 * (2^32 - 1) fits exactly.
    assert_eq!(start(config(1, 4), vec![vec![1]]), None);
    assert_eq!(
        start(config(2, 4), vec![vec![1]]),
        Some(
            "mailbox `m`: capacity `%tasks*%n*4294967295` is 8589934590, past the limit of \
             4294967295 (n = 2, tasks = 1, rounds = 1)"
                .into()
        )
    );
    let small = RunConfig {
        arena_tokens: 3,
        ..config(1, 4)
    };
    assert_eq!(
        start(small, vec![vec![1, 2]]),
        Some("the constants and tasks take 4 arena tokens, but the arena holds 3".into())
    );
    let hot = RunConfig {
        top_p: 2.0,
        ..config(1, 4)
    };
    assert!(matches!(
        Run::new(p(), hot, vec![], &engine),
        Err(StartError::Sampling(_))
    ));
}
