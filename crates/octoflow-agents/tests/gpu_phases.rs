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

/// Every runtime error the GPU records as a code, a pc and two arguments comes back as the
/// host's message (the names and capacities from the program and the run).
#[test]
fn every_fault_code_unpacks_to_the_hosts_message() {
    use octoflow_agents::gpu_state::fault_args;
    use octoflow_agents::interp::BUDGET;
    use octoflow_agents::Fault;
    use octoflow_kernels::agents::layout::*;

    let src = ".mailbox m 4\n.queue q 2\n    send m, 0\n    push q, r0\n    halt\n";
    let e = engine(1, 4);
    let cfg = RunConfig {
        arena_tokens: 64,
        ..config(1, 4)
    };
    let run = Run::new(asm(src), cfg, vec![bytes("t")], &e).unwrap();
    let (name, cap) = ("m".to_string(), 4);
    let faults = [
        (0, Fault::DivByZero),
        (
            0,
            Fault::SlotFull {
                mailbox: name.clone(),
                slot: 3,
            },
        ),
        (
            0,
            Fault::SlotEmpty {
                mailbox: name.clone(),
                slot: 2,
            },
        ),
        (
            0,
            Fault::SlotPastCapacity {
                mailbox: name.clone(),
                slot: 9,
                cap,
            },
        ),
        (
            0,
            Fault::WaitPastCapacity {
                mailbox: name.clone(),
                count: 7,
                cap,
            },
        ),
        (
            0,
            Fault::EmptyRange {
                mailbox: name,
                lo: 3,
                hi: 1,
            },
        ),
        (
            1,
            Fault::QueueFull {
                queue: "q".into(),
                cap: 2,
            },
        ),
        (1, Fault::QueueClosed { queue: "q".into() }),
        (1, Fault::TaskPastEnd { task: 5, tasks: 1 }),
        (2, Fault::NoTask),
        (2, Fault::NoSpan),
        (
            2,
            Fault::ArenaFull {
                need: 9,
                used: 60,
                cap: 64,
            },
        ),
        (
            2,
            Fault::ContextFull {
                pos: 1000,
                need: 30,
                n_ctx: 1024,
            },
        ),
        (2, Fault::NothingToGenerate),
        (2, Fault::PastEnd),
        (2, Fault::NoProgress(BUDGET)),
    ];
    let mut img = pack(&run, faults.len() as u32).unwrap();
    for (k, (pc, fault)) in faults.iter().enumerate() {
        let (code, a0, a1) = fault_args(fault);
        let rec = &mut img.events[k * EVENT_WORDS as usize..][..EVENT_WORDS as usize];
        rec[E_KIND as usize] = EV_ERROR;
        rec[E_INSTANCE as usize] = 0;
        rec[E_CODE as usize] = code;
        rec[E_PC as usize] = *pc;
        rec[E_ARG0 as usize] = a0;
        rec[E_ARG1 as usize] = a1;
    }
    img.hdr[H_EV_HEAD as usize] = faults.len() as u32;
    let events = unpack(&mut run.clone(), &img).unwrap();
    assert_eq!(events.len(), faults.len());
    for ((pc, fault), event) in faults.iter().zip(events) {
        let want = format!(
            "instance 0, {}: {fault}",
            run.program().locate(*pc as usize)
        );
        assert_eq!(
            event,
            octoflow_agents::Event::Error {
                instance: 0,
                message: want
            }
        );
    }
    // A full ring loses events: the host refuses the words rather than miss an output.
    img.hdr[H_EV_LOST as usize] = 1;
    assert!(unpack(&mut run.clone(), &img).is_err());
}

/// The layout's opcodes, specials and limits are the ISA's (the GPU decodes `Program::words`).
#[test]
fn the_layout_names_every_opcode_and_special_as_the_isa() {
    use octoflow_agents::{Op, Special};
    use octoflow_kernels::agents::layout::ALL;
    let get = |name: String| ALL.iter().find(|(n, _)| *n == name).map(|&(_, v)| v);
    for &op in Op::ALL {
        let name = format!("OP_{}", op.mnemonic().replace('.', "_").to_uppercase());
        assert_eq!(get(name.clone()), Some(op as u32), "{name}");
    }
    for &s in Special::ALL {
        let name = format!("SP_{}", s.name().to_uppercase());
        assert_eq!(get(name.clone()), Some(s as u32), "{name}");
    }
    use octoflow_kernels::agents::layout as l;
    assert_eq!(l::N_REGS as usize, octoflow_agents::isa::N_REGS);
    assert_eq!(l::BUDGET as usize, octoflow_agents::interp::BUDGET);
    assert_eq!(l::NO_STOP, octoflow_agents::isa::NO_STOP);
    assert_eq!(l::NO_TASK, octoflow_agents::isa::NO_TASK);
    assert_eq!(l::INSTR_WORDS as usize, octoflow_agents::isa::WORDS);
    let ops = ALL.iter().filter(|(n, _)| n.starts_with("OP_")).count();
    let specials = ALL.iter().filter(|(n, _)| n.starts_with("SP_")).count();
    assert_eq!((ops, specials), (Op::ALL.len(), Special::ALL.len()));
}

/// What a run's outputs say, whichever instance made them: (task, round, tokens, finish).
fn outputs_by_task(events: &[octoflow_agents::Event]) -> Vec<String> {
    let mut out: Vec<String> = events
        .iter()
        .map(|e| match e {
            octoflow_agents::Event::Output {
                task,
                round,
                tokens,
                finish,
                ..
            } => format!("{task:?} {round} {tokens:?} {finish:?}"),
            octoflow_agents::Event::Error { message, .. } => panic!("{message}"),
        })
        .collect();
    out.sort();
    out
}

/// The three dispatches compose: with the state resident on the GPU for a whole run (the host
/// only runs the forward on the rows `vm_plan` wrote), every shipped pattern gives the host's
/// outputs.
#[test]
fn a_run_resident_on_the_gpu_gives_the_hosts_outputs() {
    let Some(gpu) = Gpu::new("vm_resident") else {
        return;
    };
    for (name, pattern, cfg, tasks) in pattern_runs() {
        let max_rows = 5;
        let mut host_engine = engine(cfg.instances, max_rows);
        let mut host = Run::new(
            asm(pattern.source()),
            cfg.clone(),
            tasks.clone(),
            &host_engine,
        )
        .unwrap();
        host.set_device_sampling(true);
        let host_events = finish(&mut host, &mut host_engine, 100_000).unwrap();

        let mut e = engine(cfg.instances, max_rows);
        let run = Run::new(asm(pattern.source()), cfg.clone(), tasks.clone(), &e).unwrap();
        let shape = octoflow_kernels::agents::vm_plan::RowShape {
            max_rows: max_rows as u32,
            max_out: max_rows as u32,
            n_slots: cfg.instances as u32,
            slot_blocks: octoflow_kernels::blocks_for(octoflow_model::BatchForward::n_ctx(&e))
                as u32,
        };
        let mut resident = gpu::resident::Resident::new(&gpu, &run, shape);
        let mut events = Vec::new();
        for step in 0.. {
            assert!(step < 100_000, "{name}: no end");
            let (made, state) = resident
                .step(step, &mut e)
                .unwrap_or_else(|| panic!("{name}: deadlock at step {step}"));
            events.extend(made);
            if state.finished() {
                break;
            }
        }
        assert_eq!(
            outputs_by_task(&events),
            outputs_by_task(&host_events),
            "{name}"
        );
        println!("{name}: {} outputs", events.len());
    }
}
