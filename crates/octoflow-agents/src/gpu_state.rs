//! A run's state as the GPU interpreter's words, and back (layout:
//! [`octoflow_kernels::agents::layout`]; docs/VM.md, "On the GPU").
//!
//! [`pack`] writes everything a step reads or writes — the header (the run's constants, the step,
//! the counters), the program, the instances, the arena, the constant and stop tables, the
//! queues, the mailboxes and an empty event ring — and [`unpack`] reads the words the phases
//! wrote back into the run, returning the events the ring holds. `unpack(pack(run))` is the
//! identity on the run's state, so a GPU phase is checked by comparing the host's state after
//! the phase with the unpacked words.

use octoflow_core::Finish;
use octoflow_kernels::agents::layout::*;

use crate::memory::Fresh;
use crate::run::Run;
use crate::state::{Instance, Status, Waiting};

/// The words of a run's state, one vector per GPU buffer (see the layout's doc comment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmImage {
    pub hdr: Vec<u32>,
    pub prog: Vec<u32>,
    pub inst: Vec<u32>,
    pub arena: Vec<u32>,
    pub tables: Vec<u32>,
    pub queues: Vec<u32>,
    pub boxes: Vec<u32>,
    pub events: Vec<u32>,
}

impl VmImage {
    /// Whether the last interpret phase changed anything (`H_CHANGED`).
    pub fn changed(&self) -> bool {
        self.hdr.get(H_CHANGED as usize).is_some_and(|&w| w != 0)
    }
}

/// Why a state cannot be packed, or words cannot be unpacked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("{what} is {value}, past the GPU state's u32 words")]
    TooLarge { what: String, value: u64 },
    #[error("the GPU state is inconsistent: {0}")]
    Corrupt(String),
    #[error("{lost} events were dropped: the event ring of {cap} records was full")]
    EventsLost { lost: u32, cap: u32 },
}

fn fit(what: impl Fn() -> String, value: u64) -> Result<u32, StateError> {
    u32::try_from(value).map_err(|_| StateError::TooLarge {
        what: what(),
        value,
    })
}

fn lo(v: u64) -> u32 {
    v as u32
}

fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

fn u64_at(w: &[u32], at: u32) -> u64 {
    u64::from(w[at as usize + 1]) << 32 | u64::from(w[at as usize])
}

fn status_code(s: Status) -> u32 {
    match s {
        Status::Run => ST_RUN,
        Status::Wait => ST_WAIT,
        Status::Feed => ST_FEED,
        Status::Gen => ST_GEN,
        Status::Halted => ST_HALTED,
        Status::Error => ST_ERROR,
    }
}

fn status_of(code: u32) -> Result<Status, StateError> {
    Ok(match code {
        ST_RUN => Status::Run,
        ST_WAIT => Status::Wait,
        ST_FEED => Status::Feed,
        ST_GEN => Status::Gen,
        ST_HALTED => Status::Halted,
        ST_ERROR => Status::Error,
        _ => return Err(StateError::Corrupt(format!("status {code}"))),
    })
}

/// The `FIN_*` code of a finish.
pub fn finish_code(f: Option<Finish>) -> u32 {
    match f {
        None => FIN_NONE,
        Some(Finish::Eog) => FIN_EOG,
        Some(Finish::Stop) => FIN_STOP,
        Some(Finish::Length) => FIN_LENGTH,
        Some(Finish::Context) => FIN_CONTEXT,
    }
}

fn finish_of(code: u32) -> Result<Option<Finish>, StateError> {
    Ok(match code {
        FIN_NONE => None,
        FIN_EOG => Some(Finish::Eog),
        FIN_STOP => Some(Finish::Stop),
        FIN_LENGTH => Some(Finish::Length),
        FIN_CONTEXT => Some(Finish::Context),
        _ => return Err(StateError::Corrupt(format!("finish {code}"))),
    })
}

/// Writes `run` as the GPU's words, with an event ring of `event_cap` records.
pub fn pack(run: &Run, event_cap: u32) -> Result<VmImage, StateError> {
    let env = &run.env;
    let mem = &run.mem;
    let count = |what: &'static str, n: usize| fit(|| what.into(), n as u64);
    let n = count("instances", run.instances.len())?;
    let mut hdr = vec![0u32; H_WORDS as usize];
    let mut set = |at: u32, v: u32| hdr[at as usize] = v;
    set(H_N, n);
    set(H_TASKS, env.tasks);
    set(H_MAX, env.max);
    set(H_ROUNDS, env.rounds);
    set(H_SEED_LO, lo(env.seed));
    set(H_SEED_HI, hi(env.seed));
    set(H_N_CTX, env.n_ctx);
    set(H_CHUNK, run.chunk.min(u32::MAX as usize) as u32);
    set(H_STEP_LO, lo(run.step));
    set(H_STEP_HI, hi(run.step));
    set(H_N_INSTRS, count("instructions", run.program.instrs.len())?);
    set(H_N_QUEUES, count("queues", mem.queues.len())?);
    set(H_N_BOXES, count("mailboxes", mem.mailboxes.len())?);
    set(H_N_CONSTS, count("constants", mem.consts.len())?);
    set(H_N_STOPS, count("stop sets", mem.stops.len())?);
    set(H_N_EOG, count("end-of-generation ids", env.eog.len())?);
    let s = run.draws.sampling;
    set(H_TEMPERATURE, s.temperature.to_bits());
    set(H_TOP_K, s.top_k);
    set(H_TOP_P, s.top_p.to_bits());
    set(H_MIN_P, s.min_p.to_bits());
    set(H_ARENA_CAP, count("the arena capacity", mem.arena.cap)?);
    set(H_ARENA_USED, count("the arena", mem.arena.used())?);
    set(H_EV_CAP, event_cap);

    // Tables: constants, stop sets, sequences, their tokens, end-of-generation ids.
    let mut tables = Vec::new();
    for &(offset, len) in &mem.consts {
        tables.extend([offset, len]);
    }
    let t_stops = tables.len();
    let seqs: Vec<&Vec<u32>> = mem.stops.iter().flatten().collect();
    let t_seqs = t_stops + STOP_WORDS as usize * mem.stops.len();
    let mut first = 0;
    for stop_set in &mem.stops {
        tables.extend([first, count("stop sequences", stop_set.len())?]);
        first += stop_set.len() as u32;
    }
    let mut token_at = t_seqs + SEQ_WORDS as usize * seqs.len();
    for seq in &seqs {
        tables.extend([
            count("the tables", token_at)?,
            count("a stop sequence", seq.len())?,
        ]);
        token_at += seq.len();
    }
    for seq in &seqs {
        tables.extend(seq.iter());
    }
    let t_eog = tables.len();
    tables.extend(&env.eog);
    count("the tables", tables.len())?;
    hdr[H_T_STOPS as usize] = t_stops as u32;
    hdr[H_T_SEQS as usize] = t_seqs as u32;
    hdr[H_T_EOG as usize] = t_eog as u32;

    let mut inst = Vec::with_capacity(run.instances.len() * INST_WORDS as usize);
    for i in &run.instances {
        inst.extend(pack_instance(i));
    }
    count("the instances' words", inst.len())?;

    let mut arena = mem.arena.tokens.clone();
    arena.resize(mem.arena.cap, 0);

    Ok(VmImage {
        hdr,
        prog: run.program.words(),
        inst,
        arena,
        tables,
        queues: pack_queues(run)?,
        boxes: pack_boxes(run)?,
        events: vec![0; event_cap as usize * EVENT_WORDS as usize],
    })
}

fn pack_instance(i: &Instance) -> [u32; INST_WORDS as usize] {
    let mut w = [0u32; INST_WORDS as usize];
    let mut set = |at: u32, v: u32| w[at as usize] = v;
    set(I_ID, i.id);
    set(I_PC, i.pc);
    set(I_STATUS, status_code(i.status));
    for (r, &v) in i.regs.iter().enumerate() {
        set(I_REGS + r as u32, v);
    }
    set(I_POS, i.pos);
    if let Some(t) = i.pending {
        set(I_HAS_PENDING, 1);
        set(I_PENDING, t);
    }
    if let Some(p) = i.presample {
        set(I_HAS_PRESAMPLE, 1);
        set(I_PRE_TOKEN, p.token);
        set(I_PRE_LOGPROB, p.logprob.to_bits());
    }
    set(I_TASK, i.task);
    set(I_PARENT, i.parent);
    if let Some((offset, len)) = i.task_span {
        set(I_HAS_TASK_SPAN, 1);
        set(I_TASK_OFFSET, offset);
        set(I_TASK_LEN, len);
    }
    if let Some(s) = i.last {
        set(I_HAS_LAST, 1);
        set(I_LAST_OFFSET, s.offset);
        set(I_LAST_LEN, s.len);
        set(I_LAST_GENERATED, s.generated);
        set(I_LAST_FINISH, finish_code(s.finish));
        set(I_LAST_STOP, s.stop);
        set(I_LAST_SCORE, s.score.to_bits());
    }
    for (at, v) in [
        (I_SEED_LO, i.seed),
        (I_DRAWS_LO, i.draws),
        (I_GENERATED_LO, i.generated),
    ] {
        set(at, lo(v));
        set(at + 1, hi(v));
    }
    if let Some(t) = i.feed.first {
        set(I_FEED_HAS_FIRST, 1);
        set(I_FEED_FIRST, t);
    }
    set(I_FEED_OFFSET, i.feed.offset);
    set(I_FEED_LEN, i.feed.len);
    set(I_FEED_CURSOR, i.feed.cursor);
    set(I_GEN_LIMIT, i.gen.limit);
    set(I_GEN_STOP, i.gen.stop);
    set(I_GEN_LOGPROB_SUM, i.gen.logprob_sum.to_bits());
    let (kind, index, a, b) = match i.waiting {
        Waiting::Nothing => (WAIT_NOTHING, 0, 0, 0),
        Waiting::Mailbox {
            mailbox,
            have,
            count,
        } => (WAIT_MAILBOX, mailbox, have, count),
        Waiting::Queue {
            queue,
            pushed,
            taken,
        } => (WAIT_QUEUE, queue, pushed, taken),
    };
    set(I_WAIT_KIND, kind);
    set(I_WAIT_INDEX, index);
    set(I_WAIT_A, a);
    set(I_WAIT_B, b);
    w
}

fn pack_queues(run: &Run) -> Result<Vec<u32>, StateError> {
    let queues = &run.mem.queues;
    let mut words = vec![0u32; queues.len() * QUEUE_WORDS as usize];
    for (k, q) in queues.iter().enumerate() {
        let h = k * QUEUE_WORDS as usize;
        let items = fit(|| format!("queue `{}`'s words", q.name), words.len() as u64)?;
        let len = q.len();
        let (fresh_base, visible) = fresh_words(len, q.fresh, run.step, &q.name)?;
        let (by, step) = match q.closed {
            None => (CLOSED_OPEN, u64::MAX),
            Some((step, None)) => (CLOSED_BY_HOST, step),
            Some((step, Some(i))) => (i, step),
        };
        let head = [
            (Q_CAP, q.cap),
            (Q_ITEMS, items),
            (Q_LEN, len),
            (Q_TAKEN, q.taken),
            (Q_FRESH_STEP_LO, lo(q.fresh.step)),
            (Q_FRESH_STEP_HI, hi(q.fresh.step)),
            (Q_FRESH_BASE, fresh_base),
            (Q_VISIBLE, visible),
            (Q_CLOSED_BY, by),
            (Q_CLOSED_STEP_LO, lo(step)),
            (Q_CLOSED_STEP_HI, hi(step)),
        ];
        for (at, v) in head {
            words[h + at as usize] = v;
        }
        let start = words.len();
        words.resize(start + q.cap as usize * TASK_WORDS as usize, 0);
        for (j, t) in q.items.iter().enumerate() {
            let at = start + j * TASK_WORDS as usize;
            words[at + TASK_PARENT as usize] = t.parent;
            words[at + TASK_OFFSET as usize] = t.offset;
            words[at + TASK_LEN as usize] = t.len;
        }
    }
    fit(|| "the queues' words".into(), words.len() as u64)?;
    Ok(words)
}

/// The count before the writes of `fresh.step` and what is visible at step `now`.
fn fresh_words(total: u32, fresh: Fresh, now: u64, name: &str) -> Result<(u32, u32), StateError> {
    let base = total.checked_sub(fresh.count).ok_or_else(|| {
        StateError::Corrupt(format!("`{name}` counts more fresh writes than writes"))
    })?;
    Ok((base, if fresh.step == now { base } else { total }))
}

fn pack_boxes(run: &Run) -> Result<Vec<u32>, StateError> {
    let boxes = &run.mem.mailboxes;
    let mut words = vec![0u32; boxes.len() * BOX_WORDS as usize];
    for (k, b) in boxes.iter().enumerate() {
        let h = k * BOX_WORDS as usize;
        let slots = fit(
            || format!("mailbox `{}`'s words", b.name),
            words.len() as u64,
        )?;
        let (fresh_base, visible) = fresh_words(b.count, b.fresh, run.step, &b.name)?;
        let head = [
            (B_CAP, b.cap),
            (B_SLOTS, slots),
            (B_COUNT, b.count),
            (B_FRESH_STEP_LO, lo(b.fresh.step)),
            (B_FRESH_STEP_HI, hi(b.fresh.step)),
            (B_FRESH_BASE, fresh_base),
            (B_VISIBLE, visible),
        ];
        for (at, v) in head {
            words[h + at as usize] = v;
        }
        let start = words.len();
        words.resize(start + b.cap as usize * SLOT_WORDS as usize, 0);
        for j in 0..b.cap as usize {
            let at = start + j * SLOT_WORDS as usize;
            let w = &mut words[at..at + SLOT_WORDS as usize];
            match b.slots.get(j).copied().flatten() {
                Some(s) => {
                    let m = s.message;
                    let fields = [
                        (S_CLAIM, 1),
                        (S_SEQ, s.seq),
                        (S_STAMP_LO, lo(s.stamp)),
                        (S_STAMP_HI, hi(s.stamp)),
                        (S_OFFSET, m.span.offset),
                        (S_LEN, m.span.len),
                        (S_GENERATED, m.span.generated),
                        (S_FINISH, finish_code(m.span.finish)),
                        (S_STOP, m.span.stop),
                        (S_SCORE, m.span.score.to_bits()),
                        (S_SENDER, m.sender),
                        (S_PARENT, m.parent),
                    ];
                    for (f, v) in fields {
                        w[f as usize] = v;
                    }
                }
                // An empty slot's stamp is "not yet": a reader racing its first write never
                // takes half a stamp for an earlier step.
                None => {
                    w[S_STAMP_LO as usize] = u32::MAX;
                    w[S_STAMP_HI as usize] = u32::MAX;
                }
            }
        }
    }
    fit(|| "the mailboxes' words".into(), words.len() as u64)?;
    Ok(words)
}

mod unpack;

pub use unpack::{fault_args, outbox_events, unpack};
