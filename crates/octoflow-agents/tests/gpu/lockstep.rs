//! Driving a host run and the GPU phases in lock-step: before each phase the host's state is
//! packed, the phase runs on the GPU, and its result must equal the host's state after the
//! same phase (canonically: see `compare`).

use std::collections::BTreeMap;

use octoflow_agents::gpu_state::pack;
use octoflow_agents::plan::Plan;
use octoflow_agents::{AgentError, Run};
use octoflow_kernels::agents::layout::*;
use octoflow_kernels::agents::step_words;
use octoflow_kernels::agents::vm_plan::RowShape;
use octoflow_kernels::SamplerState;
use octoflow_model::{BatchForward, RowOutput, RowResult, TokenIn};

use super::compare::{canonical_events, compare, normalize, EVENT_CAP};
use super::{Gpu, RowTables};

/// What a lock-step run went through.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub steps: usize,
    pub rows: usize,
    pub events: usize,
    pub errors: usize,
    pub deadlock: bool,
    /// Runtime errors by kind (the message without numbers and names).
    pub faults: BTreeMap<String, usize>,
}

impl Tally {
    pub fn add(&mut self, t: &Tally) {
        self.steps += t.steps;
        self.rows += t.rows;
        self.events += t.events;
        self.errors += t.errors;
        self.deadlock |= t.deadlock;
        for (k, v) in &t.faults {
            *self.faults.entry(k.clone()).or_default() += v;
        }
    }
}

/// A runtime error's kind: its message after the location, without numbers or names.
fn fault_kind(message: &str) -> String {
    let tail = message.rsplit("): ").next().unwrap_or(message);
    let mut kind = String::new();
    let mut quoted = false;
    for c in tail.chars() {
        match c {
            '`' => quoted = !quoted,
            c if quoted || c.is_ascii_digit() => {}
            c => kind.push(c),
        }
    }
    kind.chars().take(40).collect()
}

/// The order the host must interpret in to hand out tasks as the GPU did: instances whose
/// current task changed in the phase, by the index they got (a queue hands out indices in
/// the order its takes happened), then the others. Each instance takes at most once per phase
/// in the compared programs, so that order reproduces the GPU's.
fn take_order(before: &Run, gpu: &Run) -> Vec<u32> {
    let mut keyed: Vec<(u32, u32)> = before
        .instances()
        .iter()
        .zip(gpu.instances())
        .map(|(b, g)| {
            let took = (b.task, b.parent, b.task_span) != (g.task, g.parent, g.task_span);
            (if took { g.task } else { u32::MAX }, b.id)
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// The tables `vm_plan` must write for the host's `plan` (sampled on the device).
pub fn expected_tables(run: &Run, plan: &Plan, shape: RowShape) -> RowTables {
    let (r, o) = (shape.max_rows as usize, shape.max_out as usize);
    let n = run.instances().len();
    let mut t = RowTables {
        table: vec![0; 2 * r],
        ids: vec![0; r],
        out_rows: vec![0; o],
        mix: vec![MIX_BASE; r],
        states: vec![0; o * SAMPLER_WORDS as usize],
        step: vec![0; step_words(n as u32) as usize],
        owners: vec![NONE; r],
    };
    let table_of = |slot: u32| 2 * shape.max_rows + slot * shape.slot_blocks;
    for k in 0..r {
        t.table[2 * k + 1] = table_of(shape.n_slots);
    }
    for i in 0..n {
        t.step[P_INST as usize + i * PI_WORDS as usize + PI_OUT as usize] = NONE;
    }
    let mut outs = 0usize;
    for (k, (row, owner)) in plan.rows.iter().zip(&plan.owners).enumerate() {
        t.table[2 * k] = row.pos;
        t.table[2 * k + 1] = table_of(row.slot);
        t.ids[k] = match row.token {
            TokenIn::Id(id) => id,
            TokenIn::Sampled => panic!("the host plans ids"),
        };
        t.owners[k] = owner.instance | if owner.samples { OWNER_SAMPLES } else { 0 };
        let p = P_INST as usize + owner.instance as usize * PI_WORDS as usize;
        if t.step[p + PI_COUNT as usize] == 0 {
            t.step[p + PI_FIRST as usize] = k as u32;
        }
        t.step[p + PI_COUNT as usize] += 1;
        match row.output {
            RowOutput::Sample(draw) => {
                t.step[p + PI_OUT as usize] = outs as u32;
                if outs < o {
                    t.out_rows[outs] = k as u32;
                    let s = SamplerState::from_draw(&draw).to_words();
                    t.states[outs * 8..outs * 8 + 8].copy_from_slice(&s);
                }
                outs += 1;
            }
            RowOutput::None => {}
            RowOutput::Logits => panic!("the GPU VM samples on the device"),
        }
    }
    t.step[P_ROWS as usize] = plan.rows.len() as u32;
    t.step[P_OUTS as usize] = outs as u32;
    t.step[P_GEN_ROWS as usize] = plan.gen_rows as u32;
    t
}

fn first_difference(gpu: &RowTables, host: &RowTables) -> String {
    let pairs = [
        ("table", &gpu.table, &host.table),
        ("ids", &gpu.ids, &host.ids),
        ("out_rows", &gpu.out_rows, &host.out_rows),
        ("mix", &gpu.mix, &host.mix),
        ("states", &gpu.states, &host.states),
        ("step", &gpu.step, &host.step),
        ("owners", &gpu.owners, &host.owners),
    ];
    for (name, g, h) in pairs {
        if let Some(w) = (0..g.len()).find(|&w| g[w] != h[w]) {
            return format!("{name}[{w}]: GPU {:#x}, host {:#x}", g[w], h[w]);
        }
    }
    "equal".into()
}

/// Steps `run` to its end (or a deadlock, or `max_steps`) on `engine`, holding every phase of
/// every step on the GPU to the host's. `what` names the case in failures.
pub fn lockstep(
    gpu: &Gpu,
    run: &mut Run,
    engine: &mut dyn BatchForward,
    max_steps: usize,
    what: &str,
) -> Tally {
    run.set_device_sampling(true);
    let mut tally = Tally::default();
    while !run.finished() && tally.steps < max_steps {
        let s = run.steps();
        macro_rules! fail {
            ($phase:expr, $e:expr) => {
                panic!("{what}, step {s}, {}: {}", $phase, $e)
            };
        }

        // Phase 1: interpret.
        let before = pack(run, EVENT_CAP).unwrap_or_else(|e| fail!("pack", e.to_string()));
        let used_before = before.hdr[H_ARENA_USED as usize];
        let raw = gpu.interpret(&before);
        let (img, gpu_events, gpu_run) =
            normalize(run, &raw).unwrap_or_else(|e| fail!("interpret", e));
        let changed = run.interpret_phase_in(&take_order(run, &gpu_run));
        let host_events = run.events();
        tally.events += host_events.len();
        for e in &host_events {
            if let octoflow_agents::Event::Error { message, .. } = e {
                tally.errors += 1;
                *tally.faults.entry(fault_kind(message)).or_default() += 1;
            }
        }
        let mut host = pack(run, EVENT_CAP).unwrap_or_else(|e| fail!("pack", e.to_string()));
        host.hdr[H_CHANGED as usize] = changed as u32;
        compare(img, host, used_before).unwrap_or_else(|e| fail!("interpret", e));
        let (ge, he) = (canonical_events(gpu_events), canonical_events(host_events));
        if ge != he {
            fail!("interpret events", format!("GPU {ge}\nhost {he}"));
        }

        // Phase 2: plan.
        let max_rows = engine.max_rows().max(1);
        let shape = RowShape {
            max_rows: max_rows as u32,
            max_out: max_rows as u32,
            n_slots: engine.n_slots() as u32,
            slot_blocks: octoflow_kernels::blocks_for(engine.n_ctx()) as u32,
        };
        let state = pack(run, EVENT_CAP).unwrap_or_else(|e| fail!("pack", e.to_string()));
        let tables = gpu.plan(&state, shape);
        let plan = run.plan_phase(max_rows);
        let expected = expected_tables(run, &plan, shape);
        if tables != expected {
            fail!("plan", first_difference(&tables, &expected));
        }

        // The forward on the host's engine, then phase 3: advance.
        if !plan.rows.is_empty() {
            let results = engine
                .step(&plan.rows)
                .unwrap_or_else(|e| fail!("forward", e.to_string()));
            let mut tokens = vec![0u32; max_rows];
            let mut logprobs = vec![f32::NAN; max_rows];
            for (o, &row) in tables.out_rows.iter().enumerate() {
                if (o as u32) < tables.step[P_OUTS as usize] {
                    (tokens[o], logprobs[o]) = match results[row as usize] {
                        RowResult::Token { token, logprob } => (token, logprob),
                        ref other => fail!("forward", format!("row {row}: {other:?}")),
                    };
                }
            }
            let raw = gpu.advance(&state, &tables.step, &tokens, &logprobs);
            run.advance_phase(&plan.owners, &results)
                .unwrap_or_else(|e| fail!("advance", e.to_string()));
            let (img, events, _) = normalize(run, &raw).unwrap_or_else(|e| fail!("advance", e));
            assert!(events.is_empty(), "{what}, step {s}: advance made events");
            let host = pack(run, EVENT_CAP).unwrap_or_else(|e| fail!("pack", e.to_string()));
            let used = host.hdr[H_ARENA_USED as usize];
            compare(img, host, used).unwrap_or_else(|e| fail!("advance", e));
        }
        tally.rows += plan.rows.len();
        tally.steps += 1;
        match run.end_step(plan.rows.len(), plan.gen_rows, changed) {
            Ok(_) => {}
            Err(AgentError::Deadlock(_)) => {
                tally.deadlock = true;
                break;
            }
            Err(e) => fail!("end", e.to_string()),
        }
    }
    tally
}
