//! Words back into a run: [`unpack`], the inverse of [`super::pack`], and the events of the
//! ring with their runtime errors rebuilt from a fault code and the program.

use octoflow_kernels::agents::layout::*;

use super::{finish_of, status_of, u64_at, StateError, VmImage};
use crate::error::Fault;
use crate::event::Event;
use crate::interp::BUDGET;
use crate::isa::Operand;
use crate::memory::{Fresh, Message, Slot, Span, Task};
use crate::run::Run;
use crate::state::{Feed, GenState, Instance, Presample, Waiting};

fn corrupt(what: String) -> StateError {
    StateError::Corrupt(what)
}

/// `words[at..at + len]`, or an error naming `what`.
fn slice<'a>(words: &'a [u32], at: usize, len: usize, what: &str) -> Result<&'a [u32], StateError> {
    words
        .get(at..at.saturating_add(len))
        .ok_or_else(|| corrupt(format!("{what} past its buffer ({} words)", words.len())))
}

/// Reads `image` back into `run` (instances, arena, queues, mailboxes, the step) and returns
/// the events of the ring (from `H_EV_READ` to `H_EV_HEAD`), in ring order.
pub fn unpack(run: &mut Run, image: &VmImage) -> Result<Vec<Event>, StateError> {
    let hdr = slice(&image.hdr, 0, H_WORDS as usize, "the header")?;
    let h = |at: u32| hdr[at as usize];
    let n = run.instances.len();
    if h(H_N) as usize != n {
        return Err(corrupt(format!("{} instances for a run of {n}", h(H_N))));
    }
    let mut instances = Vec::with_capacity(n);
    for i in 0..n {
        let w = slice(
            &image.inst,
            i * INST_WORDS as usize,
            INST_WORDS as usize,
            "an instance",
        )?;
        instances.push(unpack_instance(w)?);
    }
    let used = h(H_ARENA_USED) as usize;
    let tokens = slice(&image.arena, 0, used, "the arena's used tokens")?.to_vec();
    unpack_queues(run, &image.queues)?;
    unpack_boxes(run, &image.boxes)?;
    run.instances = instances;
    run.mem.arena.tokens = tokens;
    run.step = u64_at(hdr, H_STEP_LO);
    events(run, image)
}

fn unpack_instance(w: &[u32]) -> Result<Instance, StateError> {
    let g = |at: u32| w[at as usize];
    let flag = |at: u32| g(at) != 0;
    let mut regs = [0u32; crate::isa::N_REGS];
    for (r, v) in regs.iter_mut().enumerate() {
        *v = g(I_REGS + r as u32);
    }
    let waiting = match g(I_WAIT_KIND) {
        WAIT_NOTHING => Waiting::Nothing,
        WAIT_MAILBOX => Waiting::Mailbox {
            mailbox: g(I_WAIT_INDEX),
            have: g(I_WAIT_A),
            count: g(I_WAIT_B),
        },
        WAIT_QUEUE => Waiting::Queue {
            queue: g(I_WAIT_INDEX),
            pushed: g(I_WAIT_A),
            taken: g(I_WAIT_B),
        },
        k => return Err(corrupt(format!("wait kind {k}"))),
    };
    Ok(Instance {
        id: g(I_ID),
        pc: g(I_PC),
        status: status_of(g(I_STATUS))?,
        regs,
        pos: g(I_POS),
        pending: flag(I_HAS_PENDING).then(|| g(I_PENDING)),
        presample: flag(I_HAS_PRESAMPLE).then(|| Presample {
            token: g(I_PRE_TOKEN),
            logprob: f32::from_bits(g(I_PRE_LOGPROB)),
        }),
        task: g(I_TASK),
        parent: g(I_PARENT),
        task_span: flag(I_HAS_TASK_SPAN).then(|| (g(I_TASK_OFFSET), g(I_TASK_LEN))),
        last: if flag(I_HAS_LAST) {
            Some(Span {
                offset: g(I_LAST_OFFSET),
                len: g(I_LAST_LEN),
                generated: g(I_LAST_GENERATED),
                finish: finish_of(g(I_LAST_FINISH))?,
                stop: g(I_LAST_STOP),
                score: f32::from_bits(g(I_LAST_SCORE)),
            })
        } else {
            None
        },
        seed: u64_at(w, I_SEED_LO),
        draws: u64_at(w, I_DRAWS_LO),
        generated: u64_at(w, I_GENERATED_LO),
        feed: Feed {
            first: flag(I_FEED_HAS_FIRST).then(|| g(I_FEED_FIRST)),
            offset: g(I_FEED_OFFSET),
            len: g(I_FEED_LEN),
            cursor: g(I_FEED_CURSOR),
        },
        gen: GenState {
            limit: g(I_GEN_LIMIT),
            stop: g(I_GEN_STOP),
            logprob_sum: f32::from_bits(g(I_GEN_LOGPROB_SUM)),
        },
        waiting,
    })
}

/// The host's record of a step's writes: the step of the last, and how many it made.
fn fresh_of(step: u64, total: u32, base: u32, what: &str) -> Result<Fresh, StateError> {
    let count = total.checked_sub(base).ok_or_else(|| {
        corrupt(format!(
            "{what}: {base} before the last step's writes of {total}"
        ))
    })?;
    Ok(Fresh { step, count })
}

fn unpack_queues(run: &mut Run, words: &[u32]) -> Result<(), StateError> {
    for (k, q) in run.mem.queues.iter_mut().enumerate() {
        let w = slice(
            words,
            k * QUEUE_WORDS as usize,
            QUEUE_WORDS as usize,
            "a queue",
        )?;
        let g = |at: u32| w[at as usize];
        let len = g(Q_LEN);
        if g(Q_CAP) != q.cap || len > q.cap || g(Q_TAKEN) > len {
            let (cap, taken) = (g(Q_CAP), g(Q_TAKEN));
            return Err(corrupt(format!(
                "queue `{}`: capacity {cap} (run: {}), {len} pushed, {taken} taken",
                q.name, q.cap
            )));
        }
        let items = slice(
            words,
            g(Q_ITEMS) as usize,
            len as usize * TASK_WORDS as usize,
            "a queue's tasks",
        )?;
        q.items = items
            .chunks_exact(TASK_WORDS as usize)
            .map(|t| Task {
                parent: t[TASK_PARENT as usize],
                offset: t[TASK_OFFSET as usize],
                len: t[TASK_LEN as usize],
            })
            .collect();
        q.taken = g(Q_TAKEN);
        q.fresh = fresh_of(u64_at(w, Q_FRESH_STEP_LO), len, g(Q_FRESH_BASE), &q.name)?;
        let step = u64_at(w, Q_CLOSED_STEP_LO);
        q.closed = match g(Q_CLOSED_BY) {
            CLOSED_OPEN => None,
            CLOSED_BY_HOST => Some((step, None)),
            i => Some((step, Some(i))),
        };
    }
    Ok(())
}

fn unpack_boxes(run: &mut Run, words: &[u32]) -> Result<(), StateError> {
    for (k, b) in run.mem.mailboxes.iter_mut().enumerate() {
        let w = slice(
            words,
            k * BOX_WORDS as usize,
            BOX_WORDS as usize,
            "a mailbox",
        )?;
        let g = |at: u32| w[at as usize];
        if g(B_CAP) != b.cap {
            return Err(corrupt(format!(
                "mailbox `{}`: capacity {}",
                b.name,
                g(B_CAP)
            )));
        }
        let all = slice(
            words,
            g(B_SLOTS) as usize,
            b.cap as usize * SLOT_WORDS as usize,
            "a mailbox's slots",
        )?;
        let mut slots = Vec::new();
        for (j, s) in all.chunks_exact(SLOT_WORDS as usize).enumerate() {
            let f = |at: u32| s[at as usize];
            if f(S_CLAIM) == 0 {
                continue;
            }
            slots.resize(j + 1, None);
            slots[j] = Some(Slot {
                message: Message {
                    span: Span {
                        offset: f(S_OFFSET),
                        len: f(S_LEN),
                        generated: f(S_GENERATED),
                        finish: finish_of(f(S_FINISH))?,
                        stop: f(S_STOP),
                        score: f32::from_bits(f(S_SCORE)),
                    },
                    sender: f(S_SENDER),
                    parent: f(S_PARENT),
                },
                seq: f(S_SEQ),
                stamp: u64_at(s, S_STAMP_LO),
            });
        }
        b.slots = slots;
        b.count = g(B_COUNT);
        b.fresh = fresh_of(
            u64_at(w, B_FRESH_STEP_LO),
            b.count,
            g(B_FRESH_BASE),
            &b.name,
        )?;
    }
    Ok(())
}

fn events(run: &Run, image: &VmImage) -> Result<Vec<Event>, StateError> {
    let h = |at: u32| image.hdr[at as usize];
    let (cap, head, read, lost) = (h(H_EV_CAP), h(H_EV_HEAD), h(H_EV_READ), h(H_EV_LOST));
    if lost > 0 {
        return Err(StateError::EventsLost { lost, cap });
    }
    let pending = head.wrapping_sub(read);
    if pending > cap {
        return Err(corrupt(format!(
            "{pending} unread events in a ring of {cap}"
        )));
    }
    let mut out = Vec::with_capacity(pending as usize);
    for k in 0..pending {
        let at = (read.wrapping_add(k) % cap) as usize * EVENT_WORDS as usize;
        let e = slice(&image.events, at, EVENT_WORDS as usize, "an event")?;
        out.push(event(run, e, &run.mem.arena.tokens)?);
    }
    Ok(out)
}

/// The events of a chain's outbox (`vm_drain`), in ring order. `head` is the outbox's first
/// words: the header as the chain left it, the counters and the events (`O_EVENTS +
/// O_EVENTS_N × EVENT_WORDS`); `tokens` the outbox's gathered tokens, or the arena's from 0
/// when they did not fit (`O_OVERFLOW`: the events keep arena offsets; the arena only grows,
/// so the spans are still there).
pub fn outbox_events(run: &Run, head: &[u32], tokens: &[u32]) -> Result<Vec<Event>, StateError> {
    let o = |at: u32| head.get(at as usize).copied().unwrap_or(0);
    let (cap, lost) = (o(H_EV_CAP), o(H_EV_LOST));
    if head.len() < O_EVENTS as usize {
        return Err(corrupt(format!("an outbox of {} words", head.len())));
    }
    if lost > 0 {
        return Err(StateError::EventsLost { lost, cap });
    }
    if o(O_BAD) != 0 {
        return Err(corrupt("an output's span reaches past the arena".into()));
    }
    let n_ev = o(O_EVENTS_N);
    if n_ev > cap {
        return Err(corrupt(format!("{n_ev} events in a ring of {cap}")));
    }
    let ew = EVENT_WORDS as usize;
    let records = slice(
        head,
        O_EVENTS as usize,
        n_ev as usize * ew,
        "the outbox's events",
    )?;
    records
        .chunks_exact(ew)
        .map(|e| event(run, e, tokens))
        .collect()
}

fn event(run: &Run, e: &[u32], arena: &[u32]) -> Result<Event, StateError> {
    let g = |at: u32| e[at as usize];
    let instance = g(E_INSTANCE);
    match g(E_KIND) {
        EV_OUTPUT => {
            let (offset, len) = (g(E_OFFSET) as usize, g(E_LEN) as usize);
            let tokens = slice(arena, offset, len, "an output's tokens")?;
            Ok(Event::Output {
                instance,
                task: (g(E_PARENT) != crate::isa::NO_TASK).then(|| g(E_PARENT)),
                round: g(E_ROUND),
                tokens: tokens.to_vec(),
                finish: finish_of(g(E_FINISH))?,
                score: f32::from_bits(g(E_SCORE)),
            })
        }
        EV_ERROR => {
            let pc = g(E_PC);
            let fault = fault_of(run, g(E_CODE), pc, g(E_ARG0), g(E_ARG1))?;
            Ok(Event::Error {
                instance,
                message: format!(
                    "instance {instance}, {}: {fault}",
                    run.program.locate(pc as usize)
                ),
            })
        }
        kind => Err(corrupt(format!("event kind {kind}"))),
    }
}

/// The runtime error a fault code stands for at `pc` (names and capacities come from the
/// instruction's queue or mailbox operand).
fn fault_of(run: &Run, code: u32, pc: u32, a0: u32, a1: u32) -> Result<Fault, StateError> {
    let operand = run
        .program
        .instrs
        .get(pc as usize)
        .map_or(0, |i| match i.a {
            Operand::Imm(v) => v,
            _ => 0,
        }) as usize;
    let bad = || corrupt(format!("fault {code} at pc {pc} names no queue or mailbox"));
    let mailbox = || run.mem.mailboxes.get(operand).ok_or_else(bad);
    let queue = || run.mem.queues.get(operand).ok_or_else(bad);
    Ok(match code {
        F_DIV_BY_ZERO => Fault::DivByZero,
        F_SLOT_FULL => Fault::SlotFull {
            mailbox: mailbox()?.name.clone(),
            slot: a0,
        },
        F_SLOT_EMPTY => Fault::SlotEmpty {
            mailbox: mailbox()?.name.clone(),
            slot: a0,
        },
        F_SLOT_PAST_CAPACITY => Fault::SlotPastCapacity {
            mailbox: mailbox()?.name.clone(),
            slot: a0,
            cap: mailbox()?.cap,
        },
        F_WAIT_PAST_CAPACITY => Fault::WaitPastCapacity {
            mailbox: mailbox()?.name.clone(),
            count: a0,
            cap: mailbox()?.cap,
        },
        F_EMPTY_RANGE => Fault::EmptyRange {
            mailbox: mailbox()?.name.clone(),
            lo: a0,
            hi: a1,
        },
        F_QUEUE_FULL => Fault::QueueFull {
            queue: queue()?.name.clone(),
            cap: queue()?.cap,
        },
        F_QUEUE_CLOSED => Fault::QueueClosed {
            queue: queue()?.name.clone(),
        },
        F_TASK_PAST_END => Fault::TaskPastEnd {
            task: a0,
            tasks: run.env.tasks,
        },
        F_NO_TASK => Fault::NoTask,
        F_NO_SPAN => Fault::NoSpan,
        F_ARENA_FULL => Fault::ArenaFull {
            need: u64::from(a0),
            used: u64::from(a1),
            cap: run.mem.arena.cap as u64,
        },
        F_CONTEXT_FULL => Fault::ContextFull {
            pos: a0,
            need: u64::from(a1),
            n_ctx: run.env.n_ctx,
        },
        F_NOTHING_TO_GENERATE => Fault::NothingToGenerate,
        F_PAST_END => Fault::PastEnd,
        F_NO_PROGRESS => Fault::NoProgress(BUDGET),
        _ => {
            return Err(corrupt(format!(
                "instance fault {code} (operand {a0}) at pc {pc}: not a program the assembler makes"
            )))
        }
    })
}

/// The fault code and arguments the GPU records for `fault` (the inverse of the rebuilding
/// [`unpack`] does; what the tests hold the two sides to).
pub fn fault_args(fault: &Fault) -> (u32, u32, u32) {
    let narrow = |v: u64| v.min(u64::from(u32::MAX)) as u32;
    match *fault {
        Fault::DivByZero => (F_DIV_BY_ZERO, 0, 0),
        Fault::SlotFull { slot, .. } => (F_SLOT_FULL, slot, 0),
        Fault::SlotEmpty { slot, .. } => (F_SLOT_EMPTY, slot, 0),
        Fault::SlotPastCapacity { slot, .. } => (F_SLOT_PAST_CAPACITY, slot, 0),
        Fault::WaitPastCapacity { count, .. } => (F_WAIT_PAST_CAPACITY, count, 0),
        Fault::EmptyRange { lo, hi, .. } => (F_EMPTY_RANGE, lo, hi),
        Fault::QueueFull { .. } => (F_QUEUE_FULL, 0, 0),
        Fault::QueueClosed { .. } => (F_QUEUE_CLOSED, 0, 0),
        Fault::TaskPastEnd { task, .. } => (F_TASK_PAST_END, task, 0),
        Fault::NoTask => (F_NO_TASK, 0, 0),
        Fault::NoSpan => (F_NO_SPAN, 0, 0),
        Fault::ArenaFull { need, used, .. } => (F_ARENA_FULL, narrow(need), narrow(used)),
        Fault::ContextFull { pos, need, .. } => (F_CONTEXT_FULL, pos, narrow(need)),
        Fault::NothingToGenerate => (F_NOTHING_TO_GENERATE, 0, 0),
        Fault::PastEnd => (F_PAST_END, 0, 0),
        Fault::NoProgress(_) => (F_NO_PROGRESS, 0, 0),
    }
}
