//! Feeding and generating (docs/VM.md, "Feeding and generating"), on the scripted engine.

mod common;

use common::*;
use octoflow_agents::{Event, Run, Status};
use octoflow_core::Finish;

/// The only output of `events`, with its finish and score.
fn only_output(events: &[Event]) -> (Vec<u32>, Option<Finish>, f32) {
    let outs: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Output {
                tokens,
                finish,
                score,
                ..
            } => Some((tokens.clone(), *finish, *score)),
            _ => None,
        })
        .collect();
    assert_eq!(outs.len(), 1, "{events:?}");
    outs[0].clone()
}

#[test]
fn a_gen_right_after_an_append_takes_the_presample_and_costs_no_extra_step() {
    let src = "task 0\nappend.task\ngen 3, -\nemit 0\nhalt";
    let mut engine = Fake::new(1, 64, 64, successor());
    let events = run_src(src, config(1, 8), vec![vec![10, 11, 12, 13]], &mut engine).unwrap();
    assert_eq!(only_output(&events).0, vec![14, 15, 16]);
    // The prompt (the last row sampling 14), then two rows: no step feeds only to sample.
    assert_eq!(engine.steps, vec![4, 1, 1]);
    // 16 is pending: generated, never fed.
    assert_eq!(engine.slots[0], vec![10, 11, 12, 13, 14, 15]);
}

#[test]
fn the_next_append_feeds_the_pending_token_first() {
    let src = ".const C \"ab\"\ntask 0\nappend.task\ngen 2, -\nappend.const C\ngen 2, -\nset r0, %pos\nemit 0\nhalt";
    let mut engine = Fake::new(1, 64, 64, successor());
    let cfg = config(1, 8);
    let mut run = Run::new(asm(src), cfg, vec![vec![10, 11, 12, 13]], &engine).unwrap();
    let events = finish(&mut run, &mut engine, 100).unwrap();
    assert_eq!(only_output(&events).0, vec![99, 100]);
    assert_eq!(engine.steps, vec![4, 1, 3, 1]);
    assert_eq!(engine.slots[0], vec![10, 11, 12, 13, 14, 15, 97, 98, 99]);
    // Nine tokens in the slot and 100 pending.
    assert_eq!(run.instance(0).map(|i| i.regs[0]), Some(10));
}

#[test]
fn another_instruction_between_append_and_gen_discards_the_presample() {
    let src = "task 0\nappend.task\nset r0, 1\ngen 2, -\nhalt";
    let mut engine = Fake::new(1, 64, 64, successor());
    let events = run_src(src, config(1, 8), vec![vec![10]], &mut engine).unwrap();
    assert_eq!(
        errors(&events),
        vec![
            "instance 0, pc 3 (line 4: `gen 2, -`): nothing to generate from (no presample and \
             no pending token; append something first)"
        ]
    );
}

/// Runs `gen` on `task` with stop set `S`, returning the output and `%len %finish %stop`.
fn gen_with_stops(task: u32, limit: u32) -> ((Vec<u32>, Option<Finish>, f32), [u32; 3]) {
    let src = format!(
        ".stop S \"d\", \"cd\", \"xyz\", 7\ntask 0\nappend.task\ngen {limit}, S\n\
         set r0, %len\nset r1, %finish\nset r2, %stop\nemit 0\nhalt"
    );
    // 255 is followed by the end-of-generation token.
    let next: Next = Box::new(|ctx: &[u32]| match ctx.last() {
        Some(255) => EOG,
        Some(&t) => (t + 1) % 256,
        None => 0,
    });
    let mut engine = Fake::new(1, 64, 64, next);
    let mut run = Run::new(asm(&src), config(1, 8), vec![vec![task]], &engine).unwrap();
    let events = finish(&mut run, &mut engine, 100).unwrap();
    let regs = run.instance(0).map(|i| i.regs).unwrap_or_default();
    (only_output(&events), [regs[0], regs[1], regs[2]])
}

#[test]
fn a_stop_set_sequence_ends_the_span_and_is_trimmed_longest_first() {
    // a → b c d: the span ends with "d" and with "cd"; the longer is trimmed.
    let ((tokens, finish, _), specials) = gen_with_stops(b'a' as u32, 10);
    assert_eq!(tokens, vec![b'b' as u32]);
    assert_eq!(finish, Some(Finish::Stop));
    assert_eq!(
        specials,
        [1, 1, 2 + 1],
        "%len, %finish (stop), %stop (sequence 1)"
    );
}

#[test]
fn a_single_id_entry_of_a_stop_set_stops_too() {
    let ((tokens, finish, _), specials) = gen_with_stops(4, 10);
    assert_eq!(tokens, vec![5, 6]);
    assert_eq!(finish, Some(Finish::Stop));
    assert_eq!(specials, [2, 1, 2 + 3]);
}

#[test]
fn an_end_of_generation_token_ends_the_span_and_is_trimmed() {
    let ((tokens, finish, _), specials) = gen_with_stops(254, 10);
    assert_eq!(tokens, vec![255]);
    assert_eq!(finish, Some(Finish::Eog));
    assert_eq!(specials, [1, 1, 1]);
}

#[test]
fn the_token_limit_ends_the_span_with_finish_length() {
    let ((tokens, finish, score), specials) = gen_with_stops(b'A' as u32, 3);
    assert_eq!(tokens, vec![66, 67, 68]);
    assert_eq!(finish, Some(Finish::Length));
    assert_eq!(specials, [3, 2, 0]);
    assert!(score.is_finite() && score < 0.0, "{score}");
}

#[test]
fn gen_of_zero_tokens_is_an_empty_span_at_once() {
    let src = "task 0\nappend.task\ngen 0, -\nemit 0\nhalt";
    let mut engine = Fake::new(1, 64, 64, successor());
    let events = run_src(src, config(1, 8), vec![vec![10]], &mut engine).unwrap();
    let (tokens, finish, score) = only_output(&events);
    assert_eq!((tokens, finish), (vec![], Some(Finish::Length)));
    assert_eq!(score, f32::NEG_INFINITY);
}

#[test]
fn a_full_context_ends_the_span_and_then_refuses_appends() {
    let src = ".const C \"x\"\ntask 0\nappend.task\ngen 10, -\nset r0, %pos\nemit 0\nappend.const C\nhalt";
    let mut engine = Fake::new(1, 8, 64, successor());
    let mut run = Run::new(asm(src), config(1, 10), vec![vec![1, 2, 3, 4]], &engine).unwrap();
    let events = finish(&mut run, &mut engine, 100).unwrap();
    let (tokens, finish, _) = only_output(&events);
    assert_eq!(tokens, vec![5, 6, 7, 8]);
    assert_eq!(finish, Some(Finish::Context));
    assert_eq!(run.instance(0).map(|i| i.regs[0]), Some(8));
    assert_eq!(
        errors(&events),
        vec!["instance 0, pc 5 (line 7: `append.const C`): context full: 1 more tokens after 8 of 8 positions"]
    );
    assert_eq!(run.instance(0).map(|i| i.status), Some(Status::Error));
}

#[test]
fn a_prompt_longer_than_the_context_is_a_runtime_error() {
    let src = "task 0\nappend.task\ngen 1, -\nhalt";
    let mut engine = Fake::new(1, 8, 64, successor());
    let events = run_src(src, config(1, 10), vec![vec![1; 9]], &mut engine).unwrap();
    assert_eq!(
        errors(&events),
        vec!["instance 0, pc 1 (line 2: `append.task`): context full: 9 more tokens after 0 of 8 positions"]
    );
    assert!(engine.steps.is_empty());
}

#[test]
fn reset_empties_the_context_so_the_next_feed_starts_at_zero() {
    let src = "task 0\nappend.task\ngen 3, -\nemit 0\nreset\nappend.task\ngen 3, -\nemit 1\nhalt";
    // The next token depends on the whole context: a stale cache would change it.
    let next: Next = Box::new(|ctx: &[u32]| ctx.iter().sum::<u32>() % 200);
    let mut engine = Fake::new(1, 64, 64, next);
    let events = run_src(src, config(1, 8), vec![vec![3, 5, 7]], &mut engine).unwrap();
    let outs = outputs(&events);
    assert_eq!(outs.len(), 2);
    assert_eq!(outs[0].3, outs[1].3);
    assert_eq!(outs[0].3, vec![15, 30, 60]);
    assert_eq!(engine.slots[0], vec![3, 5, 7, 15, 30]);
}

#[test]
fn the_draws_follow_the_seed_and_counter_not_the_instance() {
    // Two instances generate the same task with `seed 5`: same tokens at temperature 1.
    // A third keeps its default seed (run seed + 2) and differs.
    let src = "task 0\nbeq %id, 2, go\nseed 5\ngo:\nreset\nappend.task\ngen 24, -\nemit 0\nhalt";
    let next: Next = Box::new(|ctx: &[u32]| ctx.iter().sum::<u32>() % 256);
    let mut engine = Fake::new(3, 64, 64, next);
    engine.peak = |_| 0.5;
    let cfg = octoflow_agents::RunConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 1000,
        ..config(3, 24)
    };
    let events = run_src(src, cfg, vec![vec![1, 2, 3]], &mut engine).unwrap();
    let outs = outputs(&events);
    assert_eq!(outs.len(), 3);
    assert_eq!(outs[0].3, outs[1].3);
    assert_ne!(outs[0].3, outs[2].3);
}

#[test]
fn generating_instances_get_rows_before_feeding_ones() {
    let src = "task %id\nappend.task\ngen 5, -\nemit 0\nhalt";
    let mut engine = Fake::new(3, 64, 2, successor());
    let tasks = vec![vec![10], vec![20], vec![30, 31, 32, 33, 34, 35]];
    let mut run = Run::new(asm(src), config(3, 5), tasks, &engine).unwrap();
    // Step 0: instances 0 and 1 feed one row each; then they generate (one row each, a step)
    // until done, and instance 2 waits for room.
    for _ in 0..5 {
        run.step(&mut engine).unwrap();
        assert_eq!(run.instance(2).map(|i| i.pos), Some(0));
    }
    let events = finish(&mut run, &mut engine, 100).unwrap();
    let outs = outputs(&events);
    assert_eq!(outs.len(), 3);
    assert_eq!(outs[2].3, vec![36, 37, 38, 39, 40]);
    assert!(engine.steps.iter().all(|&r| r <= 2), "{:?}", engine.steps);
}
