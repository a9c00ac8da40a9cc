//! The GPU interpreter (octoflow-kernels' `agents` family) held to the host interpreter phase
//! by phase: the host run's state is packed before each phase, the phase runs on the GPU and
//! the words it leaves must be the host's state after the same phase (docs/VM.md, "On the
//! GPU"). Without a device these tests skip (`OCTOFLOW_SKIP_GPU_TESTS=1`), except the
//! packing round trip, which needs none.

mod common;
mod gpu;

use common::*;
use gpu::compare::EVENT_CAP;
use gpu::lockstep::lockstep;
use gpu::Gpu;
use octoflow_agents::gpu_state::{pack, unpack};
use octoflow_agents::{Pattern, Run, RunConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Pattern runs: a next token that ends lines and generations now and then.
fn chatter(ctx: &[u32]) -> u32 {
    let h = ctx.iter().fold(7u64, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3)
    });
    match (h >> 7) % 11 {
        0 => EOG,
        1 | 2 => u32::from(b'\n'),
        k => u32::from(b'a') + k as u32,
    }
}

/// The shipped patterns with a few instance, task and round counts.
fn pattern_runs() -> Vec<(String, Pattern, RunConfig, Vec<Vec<u32>>)> {
    let mut out = Vec::new();
    for pattern in Pattern::ALL {
        for (instances, tasks, rounds) in [(1, 2, 1), (3, 3, 2), (5, 4, 2)] {
            let cfg = RunConfig {
                rounds,
                chunk: [3, 64][instances % 2],
                device_sampling: true,
                // Greedy, and sampled (with a top-k the device sampler takes).
                temperature: [0.0, 0.8][instances % 2],
                top_k: 20,
                arena_tokens: 1 << 14,
                ..config(instances, 5)
            };
            let tasks: Vec<Vec<u32>> = (0..tasks).map(|t| bytes(&format!("task {t}?"))).collect();
            let name = format!(
                "{} n={instances} tasks={} rounds={rounds}",
                pattern.name(),
                tasks.len()
            );
            out.push((name, pattern, cfg, tasks));
        }
    }
    out
}

fn engine(instances: usize, max_rows: usize) -> Fake {
    let mut e = Fake::new(instances, 1024, max_rows, Box::new(chatter));
    e.device = true;
    e
}

#[test]
fn pack_then_unpack_gives_back_every_pattern_state_mid_run() {
    let mut checked = 0;
    for (name, pattern, cfg, tasks) in pattern_runs() {
        let mut e = engine(cfg.instances, 16);
        let program = asm(pattern.source());
        let mut run = Run::new(program.clone(), cfg.clone(), tasks.clone(), &e).unwrap();
        while !run.finished() {
            let img = pack(&run, 8).unwrap();
            // A fresh run of the same program: every word must come back from the image.
            let mut fresh = Run::new(program.clone(), cfg.clone(), tasks.clone(), &e).unwrap();
            let events = unpack(&mut fresh, &img).unwrap();
            assert!(events.is_empty(), "{name}");
            let text = |r: &Run| format!("{:#?}\n{:#?}\n{}", r.instances(), r.memory(), r.steps());
            assert_eq!(text(&fresh), text(&run), "{name}, step {}", run.steps());
            assert_eq!(
                pack(&fresh, 8).unwrap(),
                img,
                "{name}: packing is not canonical"
            );
            checked += 1;
            run.step(&mut e).unwrap();
            run.events();
        }
    }
    assert!(checked > 100, "{checked} states");
}

#[test]
fn every_phase_matches_the_host_on_the_shipped_patterns() {
    let Some(gpu) = Gpu::new("vm_phases_patterns") else {
        return;
    };
    for (name, pattern, cfg, tasks) in pattern_runs() {
        for max_rows in [3, 64] {
            let mut e = engine(cfg.instances, max_rows);
            let mut run = Run::new(asm(pattern.source()), cfg.clone(), tasks.clone(), &e).unwrap();
            let what = format!("{name} max_rows={max_rows}");
            let tally = lockstep(&gpu, &mut run, &mut e, 20_000, &what);
            assert!(run.finished(), "{what}: {tally:?}");
            assert_eq!(tally.errors, 0, "{what}");
            println!("{what}: {tally:?}");
        }
    }
}

#[test]
fn every_phase_matches_the_host_on_random_programs() {
    let Some(gpu) = Gpu::new("vm_phases_random") else {
        return;
    };
    let seed: u64 = std::env::var("OCTOFLOW_VM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let cases: usize = std::env::var("OCTOFLOW_VM_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    println!("random programs: seed {seed} (OCTOFLOW_VM_SEED), {cases} cases");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut totals = gpu::lockstep::Tally::default();
    for k in 0..cases {
        let case_seed: u64 = rng.gen();
        let case = gpu::random::case(&mut StdRng::seed_from_u64(case_seed));
        let what = format!(
            "seed {seed}, case {k} (case seed {case_seed})\n{}",
            case.src
        );
        let cfg = RunConfig {
            max_tokens: case.max_tokens,
            chunk: case.chunk,
            arena_tokens: case.arena.unwrap_or(1 << 15),
            device_sampling: true,
            ..config(case.instances, case.max_tokens)
        };
        let mut e = Fake::new(
            case.instances,
            case.n_ctx,
            case.max_rows,
            Box::new(gpu::random::next),
        );
        e.device = true;
        let program = asm(&case.src);
        let mut run = Run::new(program, cfg, case.tasks.clone(), &e).unwrap();
        let t = lockstep(&gpu, &mut run, &mut e, 100, &what);
        totals.add(&t);
    }
    println!("{totals:#?}");
    assert!(totals.rows > 0 && totals.events > 0, "{totals:?}");
    if cases >= 300 {
        // Most runtime errors show up (seen: 12 to 15 kinds in 300 to 600 cases).
        assert!(totals.faults.len() >= 10, "{totals:#?}");
    }
}

/// 2,000 instances each loop `take`, `push`, two `send`s and a `gen` over 6,000 tasks in one
/// interpret phase: every task is taken once, every push lands at the index it returned, every
/// slot is written once and the arena's allocations are disjoint and account for every token.
#[test]
fn thousands_of_instances_contend_without_losing_or_doubling_anything() {
    let Some(gpu) = Gpu::new("vm_contention") else {
        return;
    };
    let (n, n_tasks) = (2000usize, 6000usize);
    let src = "
.const C \"abc\"
.queue work %tasks
.mailbox box %tasks
.mailbox dup %tasks
    append.const C      ; the context is then full but for the presample
    gen 3, -            ; one token, then the context is full: done at once
again:
    take tasks, done
    push work, r1
    send box, %task
    send dup, r1
    gen 3, -            ; a full context: an empty span of 3 slots, done at once
    jmp again
done:
    halt
";
    let mut e = Fake::new(n, 4, 3 * n, successor());
    e.device = true;
    let tasks: Vec<Vec<u32>> = (0..n_tasks).map(|t| vec![(t % 250) as u32 + 1]).collect();
    let cfg = RunConfig {
        arena_tokens: 1 << 16,
        device_sampling: true,
        ..config(n, 8)
    };
    let mut run = Run::new(asm(src), cfg, tasks, &e).unwrap();
    run.step(&mut e).unwrap(); // every instance feeds the constant
    assert!(run.instances().iter().all(|i| i.presample.is_some()));
    let img = pack(&run, EVENT_CAP).unwrap();
    let used_before = img.hdr[octoflow_kernels::agents::layout::H_ARENA_USED as usize];
    let t0 = std::time::Instant::now();
    let raw = gpu.interpret(&img);
    println!(
        "{n} instances, {n_tasks} tasks: interpret phase {:?}",
        t0.elapsed()
    );
    let mut after = run.clone();
    let events = unpack(&mut after, &raw).unwrap();
    assert!(events.is_empty(), "{events:?}");
    let mem = after.memory();
    let (tasks_q, work) = (&mem.queues[0], &mem.queues[1]);
    assert_eq!(
        (tasks_q.taken(), work.len()),
        (n_tasks as u32, n_tasks as u32)
    );
    let (boxes, dups) = (&mem.mailboxes[0], &mem.mailboxes[1]);
    assert_eq!(
        (boxes.written(), dups.written()),
        (n_tasks as u32, n_tasks as u32)
    );
    // Slot t of `box` holds the span pushed for host task t; slot j of `dup` the span pushed
    // at index j: the two agree, so each take, push and send landed once and where it said.
    let mut spans = Vec::new();
    for j in 0..n_tasks as u32 {
        let item = work.get(j).unwrap();
        let d = dups.read(j, u64::MAX).unwrap();
        assert_eq!(
            (d.span.offset, d.span.len),
            (item.offset, item.len),
            "dup {j}"
        );
        let b = boxes.read(item.parent, u64::MAX).unwrap();
        assert_eq!(b.span.offset, item.offset, "box {}", item.parent);
        assert_eq!((b.parent, d.parent), (item.parent, item.parent));
        spans.push(item.offset);
    }
    let mut halted = 0;
    for inst in after.instances() {
        if inst.status == octoflow_agents::Status::Halted {
            halted += 1;
        }
        spans.push(inst.last.unwrap().offset);
    }
    assert_eq!(halted, n);
    // Every `gen` took 3 tokens: n + n_tasks disjoint allocations filling the arena's growth.
    spans.sort_unstable();
    spans.dedup();
    assert_eq!(spans.len(), n + n_tasks, "allocations shared");
    for w in spans.windows(2) {
        assert!(
            w[1] - w[0] >= 3,
            "allocations {} and {} overlap",
            w[0],
            w[1]
        );
    }
    assert_eq!(spans[0], used_before);
    assert_eq!(
        after.arena_used() as u32,
        used_before + 3 * (n + n_tasks) as u32
    );
}
