//! The agent VM's state on the GPU, word by word (docs/VM.md, "On the GPU"): defined once here,
//! mirrored in `shaders/agents/layout.glsl` (a test holds the two equal), packed and unpacked by
//! `octoflow_agents::gpu_state`.
//!
//! The state is a handful of u32 storage buffers, each an array of fixed-size records:
//!
//! - **header** (`H_*`, [`H_WORDS`]): the run's constants (specials, context, sampling, table
//!   offsets), the step number and the counters every instance bumps atomically (arena, events,
//!   "something changed").
//! - **program**: [`INSTR_WORDS`] per instruction, `octoflow_agents::Program::words`.
//! - **instances** (`I_*`, [`INST_WORDS`] each): an `Option` is a flag word and its value words
//!   (zero when absent); u64 counters and seeds are two words, low first; f32 are their bits.
//! - **arena**: one token per word, `H_ARENA_CAP` of them; `H_ARENA_USED` is the bump pointer.
//! - **tables**: constants (`(offset, len)` in the arena), then stop sets (`(first sequence,
//!   sequences)`) at `H_T_STOPS`, sequences (`(first token, len)`, tokens in this buffer) at
//!   `H_T_SEQS`, end-of-generation ids at `H_T_EOG`.
//! - **queues**: a header per queue (`Q_*`) then the tasks (`TASK_*`) from `Q_ITEMS`.
//! - **mailboxes**: a header per mailbox (`B_*`) then the slots (`S_*`) from `B_SLOTS`.
//! - **events**: a ring of [`EVENT_WORDS`]-word records (outputs and runtime errors).
//! - **rows** (written by `vm_plan`, read by the batched forward and `vm_advance`): the
//!   forward's own tables (`(position, block table offset)` pairs, token ids, output rows, adapter
//!   mixes, [`SAMPLER_WORDS`]-word sampler states), a step record (`P_*` then `PI_*` per
//!   instance) and a per-row owner table (`OWNER_*`).
//!
//! Visibility (docs/VM.md) needs what a queue or mailbox held when the step began while other
//! instances write to it: `vm_interpret` first snapshots it (`Q_VISIBLE`, `B_VISIBLE`, written
//! by nobody else during the phase). The host's "writes of the current step" record is kept as
//! the step of the last write (`*_FRESH_STEP_*`) and the count before that step's writes
//! (`*_FRESH_BASE`), which every writer of a step can set to the same values without ordering.

macro_rules! layout {
    ($($(#[$meta:meta])* $name:ident = $value:expr;)*) => {
        $($(#[$meta])* pub const $name: u32 = $value;)*

        /// Every constant by name, in declaration order (what `layout.glsl` must mirror).
        pub const ALL: &[(&str, u32)] = &[$((stringify!($name), $name)),*];
    };
}

layout! {
    // ---- the header ----
    /// Instances in the run (`%n`).
    H_N = 0;
    /// Host tasks (`%tasks`).
    H_TASKS = 1;
    /// `%max`.
    H_MAX = 2;
    /// `%rounds`.
    H_ROUNDS = 3;
    /// The run seed, low word.
    H_SEED_LO = 4;
    H_SEED_HI = 5;
    /// Context positions per instance.
    H_N_CTX = 6;
    /// Most prompt rows one instance gets per step.
    H_CHUNK = 7;
    /// The step being run (`now`), low word.
    H_STEP_LO = 8;
    H_STEP_HI = 9;
    /// Instructions in the program.
    H_N_INSTRS = 10;
    /// Queues, `tasks` included.
    H_N_QUEUES = 11;
    H_N_BOXES = 12;
    H_N_CONSTS = 13;
    H_N_STOPS = 14;
    /// End-of-generation ids at `H_T_EOG` of the tables.
    H_N_EOG = 15;
    /// Sampling: temperature (f32 bits), top-k, top-p (f32 bits), min-p (f32 bits).
    H_TEMPERATURE = 16;
    H_TOP_K = 17;
    H_TOP_P = 18;
    H_MIN_P = 19;
    /// Arena capacity in tokens.
    H_ARENA_CAP = 20;
    /// Arena tokens taken: the bump pointer `gen` advances with a compare-and-swap loop.
    H_ARENA_USED = 21;
    /// Where the stop-set table starts in the tables buffer.
    H_T_STOPS = 22;
    /// Where the stop-sequence table starts.
    H_T_SEQS = 23;
    /// Where the end-of-generation ids start.
    H_T_EOG = 24;
    /// Event ring capacity in records.
    H_EV_CAP = 25;
    /// Events appended so far (atomic); record `k` sits at `k % H_EV_CAP`.
    H_EV_HEAD = 26;
    /// The host's read cursor: records from here to `H_EV_HEAD` are unread.
    H_EV_READ = 27;
    /// Events dropped because the ring was full (the host fails the run on any).
    H_EV_LOST = 28;
    /// Set to 1 by an interpret phase in which something changed (the deadlock check).
    H_CHANGED = 29;
    /// Set to 1 by `vm_end_step` after a step in which no instance had rows and nothing
    /// changed while some were live: they wait for what cannot come (the host reports a
    /// deadlock). Sticky until the host clears it.
    H_STALLED = 30;
    /// Live instances (neither halted nor failed) after the last step (`vm_end_step`).
    H_LIVE = 31;
    /// Words of the header.
    H_WORDS = 32;

    // ---- the program ----
    /// Words per instruction: `op | kind(a) << 8 | kind(b) << 10 | kind(c) << 12`, a, b, c.
    INSTR_WORDS = 4;
    /// Operand kinds.
    K_IMM = 0;
    K_REG = 1;
    K_SPECIAL = 2;
    /// Opcodes (the order of `octoflow_agents::Op`).
    OP_HALT = 0;
    OP_SET = 1;
    OP_ADD = 2;
    OP_SUB = 3;
    OP_MUL = 4;
    OP_DIV = 5;
    OP_REM = 6;
    OP_JMP = 7;
    OP_BEQ = 8;
    OP_BNE = 9;
    OP_BLT = 10;
    OP_BGE = 11;
    OP_APPEND_TASK = 12;
    OP_APPEND_CONST = 13;
    OP_APPEND_LAST = 14;
    OP_APPEND_MSG = 15;
    OP_GEN = 16;
    OP_SEND = 17;
    OP_WAIT = 18;
    OP_BEST = 19;
    OP_TAKE = 20;
    OP_TASK = 21;
    OP_PUSH = 22;
    OP_CLOSE = 23;
    OP_EMIT = 24;
    OP_RESET = 25;
    OP_SEED = 26;
    /// Specials (the order of `octoflow_agents::Special`).
    SP_ID = 0;
    SP_N = 1;
    SP_TASK = 2;
    SP_PARENT = 3;
    SP_TASKS = 4;
    SP_MAX = 5;
    SP_ROUNDS = 6;
    SP_LEN = 7;
    SP_FINISH = 8;
    SP_POS = 9;
    SP_STOP = 10;
    /// `gen n, -`: end-of-generation tokens only.
    NO_STOP = 0xffff_ffff;
    /// `%task` and `%parent` before the first `take` or `task`.
    NO_TASK = 0xffff_ffff;
    /// Registers per instance.
    N_REGS = 16;
    /// Most instructions per instance per interpret phase.
    BUDGET = 4096;

    // ---- an instance ----
    I_ID = 0;
    I_PC = 1;
    /// One of `ST_*`.
    I_STATUS = 2;
    /// `r0` (the registers follow).
    I_REGS = 3;
    /// Positions in the KV slot.
    I_POS = 19;
    /// The pending token: flag and id.
    I_HAS_PENDING = 20;
    I_PENDING = 21;
    /// The presample: flag, id, log-probability (f32 bits).
    I_HAS_PRESAMPLE = 22;
    I_PRE_TOKEN = 23;
    I_PRE_LOGPROB = 24;
    I_TASK = 25;
    I_PARENT = 26;
    /// The current task's tokens: flag, arena offset, length.
    I_HAS_TASK_SPAN = 27;
    I_TASK_OFFSET = 28;
    I_TASK_LEN = 29;
    /// The last span: flag, offset, kept length, generated, finish (`FIN_*`), `%stop`, score.
    I_HAS_LAST = 30;
    I_LAST_OFFSET = 31;
    I_LAST_LEN = 32;
    I_LAST_GENERATED = 33;
    I_LAST_FINISH = 34;
    I_LAST_STOP = 35;
    I_LAST_SCORE = 36;
    /// Seed, draw counter and tokens generated over the run: u64 each.
    I_SEED_LO = 37;
    I_SEED_HI = 38;
    I_DRAWS_LO = 39;
    I_DRAWS_HI = 40;
    I_GENERATED_LO = 41;
    I_GENERATED_HI = 42;
    /// The feed: the pending token it starts with (flag, id), then arena offset, length and
    /// tokens fed so far.
    I_FEED_HAS_FIRST = 43;
    I_FEED_FIRST = 44;
    I_FEED_OFFSET = 45;
    I_FEED_LEN = 46;
    I_FEED_CURSOR = 47;
    /// The `gen` in progress: limit, stop set (or `NO_STOP`), sum of log-probabilities.
    I_GEN_LIMIT = 48;
    I_GEN_STOP = 49;
    I_GEN_LOGPROB_SUM = 50;
    /// What a waiting instance waits for: `WAIT_*`, the queue or mailbox, two numbers
    /// (mailbox: have, count; queue: pushed, taken).
    I_WAIT_KIND = 51;
    I_WAIT_INDEX = 52;
    I_WAIT_A = 53;
    I_WAIT_B = 54;
    /// Words per instance (the rest are zero).
    INST_WORDS = 64;

    /// Instance states (`octoflow_agents::Status`).
    ST_RUN = 0;
    ST_WAIT = 1;
    ST_FEED = 2;
    ST_GEN = 3;
    ST_HALTED = 4;
    ST_ERROR = 5;
    /// Finishes (`octoflow_core::Finish`, 0 for none).
    FIN_NONE = 0;
    FIN_EOG = 1;
    FIN_STOP = 2;
    FIN_LENGTH = 3;
    FIN_CONTEXT = 4;
    /// Wait reasons.
    WAIT_NOTHING = 0;
    WAIT_MAILBOX = 1;
    WAIT_QUEUE = 2;

    // ---- tables ----
    /// Per constant: arena offset, length (from word 0 of the tables).
    CONST_WORDS = 2;
    /// Per stop set: first sequence, sequences.
    STOP_WORDS = 2;
    /// Per stop sequence: first token (in the tables buffer), length.
    SEQ_WORDS = 2;

    // ---- queues ----
    Q_CAP = 0;
    /// Where the queue's tasks start in the queues buffer.
    Q_ITEMS = 1;
    /// Tasks pushed (a compare-and-swap loop bounded by `Q_CAP`).
    Q_LEN = 2;
    /// Tasks taken (a compare-and-swap loop bounded by `Q_VISIBLE`).
    Q_TAKEN = 3;
    /// The step of the last push, and `Q_LEN` before that step's pushes.
    Q_FRESH_STEP_LO = 4;
    Q_FRESH_STEP_HI = 5;
    Q_FRESH_BASE = 6;
    /// Tasks visible this step (the phase's snapshot).
    Q_VISIBLE = 7;
    /// `CLOSED_OPEN`, `CLOSED_BY_HOST` or the closing instance (the lowest of a step's
    /// closers: an atomic min, as the host's first in instance order).
    Q_CLOSED_BY = 8;
    /// The step of the close (`u64::MAX` while open, so a racing reader never sees it past).
    Q_CLOSED_STEP_LO = 9;
    Q_CLOSED_STEP_HI = 10;
    QUEUE_WORDS = 12;
    CLOSED_OPEN = 0xffff_fffe;
    CLOSED_BY_HOST = 0xffff_ffff;
    /// A task: parent host task, arena offset, length.
    TASK_PARENT = 0;
    TASK_OFFSET = 1;
    TASK_LEN = 2;
    TASK_WORDS = 3;

    // ---- mailboxes ----
    B_CAP = 0;
    /// Where the mailbox's slots start in the mailboxes buffer.
    B_SLOTS = 1;
    /// Messages written (atomic add after a slot's write).
    B_COUNT = 2;
    /// The step of the last send, and `B_COUNT` before that step's sends.
    B_FRESH_STEP_LO = 3;
    B_FRESH_STEP_HI = 4;
    B_FRESH_BASE = 5;
    /// Messages visible this step (the phase's snapshot).
    B_VISIBLE = 6;
    BOX_WORDS = 8;
    /// A slot: claimed (0/1, compare-and-swap: a second writer gets `slot full`), sequence
    /// number, the step of the write (`u64::MAX` while empty), the span, sender, parent.
    S_CLAIM = 0;
    S_SEQ = 1;
    S_STAMP_LO = 2;
    S_STAMP_HI = 3;
    S_OFFSET = 4;
    S_LEN = 5;
    S_GENERATED = 6;
    S_FINISH = 7;
    S_STOP = 8;
    S_SCORE = 9;
    S_SENDER = 10;
    S_PARENT = 11;
    SLOT_WORDS = 12;

    // ---- events ----
    /// `EV_OUTPUT` or `EV_ERROR`.
    E_KIND = 0;
    E_INSTANCE = 1;
    /// An output: `%parent`, round, span offset, kept length, finish, `%stop`, score bits.
    E_PARENT = 2;
    E_ROUND = 3;
    E_OFFSET = 4;
    E_LEN = 5;
    E_FINISH = 6;
    E_STOP = 7;
    E_SCORE = 8;
    /// An error: fault code (`F_*`), pc and two arguments (see `F_*`).
    E_CODE = 2;
    E_PC = 3;
    E_ARG0 = 4;
    E_ARG1 = 5;
    EVENT_WORDS = 9;
    EV_OUTPUT = 1;
    EV_ERROR = 2;

    // ---- fault codes (`octoflow_agents::Fault`; arguments in E_ARG0, E_ARG1) ----
    F_DIV_BY_ZERO = 1;
    /// Slot.
    F_SLOT_FULL = 2;
    /// Slot.
    F_SLOT_EMPTY = 3;
    /// Slot.
    F_SLOT_PAST_CAPACITY = 4;
    /// Count.
    F_WAIT_PAST_CAPACITY = 5;
    /// lo, hi.
    F_EMPTY_RANGE = 6;
    F_QUEUE_FULL = 7;
    F_QUEUE_CLOSED = 8;
    /// Task.
    F_TASK_PAST_END = 9;
    F_NO_TASK = 10;
    F_NO_SPAN = 11;
    /// Tokens asked, tokens taken (as the failing instance saw them).
    F_ARENA_FULL = 12;
    /// `%pos`, tokens asked.
    F_CONTEXT_FULL = 13;
    F_NOTHING_TO_GENERATE = 14;
    F_PAST_END = 15;
    F_NO_PROGRESS = 16;
    /// An operand no assembled program has (a name's index past its table): the GPU's
    /// guard, never raised for a program from the assembler.
    F_BAD_OPERAND = 17;

    // ---- rows of a step (vm_plan) ----
    /// The step record: rows, output rows (all of them, even past the output table), rows of
    /// generating instances; then `PI_WORDS` per instance from `P_INST`.
    P_ROWS = 0;
    P_OUTS = 1;
    P_GEN_ROWS = 2;
    P_INST = 4;
    /// Per instance: its first row, its rows, its output row (or `NONE`).
    PI_FIRST = 0;
    PI_COUNT = 1;
    PI_OUT = 2;
    PI_WORDS = 3;
    /// A row's owner: the instance, with `OWNER_SAMPLES` when the row asks for a token;
    /// `NONE` for padding.
    OWNER_SAMPLES = 0x8000_0000;
    NONE = 0xffff_ffff;
    /// Words of a sampler state (`crate::SamplerState`).
    SAMPLER_WORDS = 8;
    /// A row's adapter mix: the base model (`GpuAdapters::mix_of(None)` in octoflow-model).
    MIX_BASE = 0;

    // ---- a chain's outbox (vm_drain): the header's words first (`H_WORDS`) ----
    /// Events copied (the ring's unread ones, in ring order, from `O_EVENTS`).
    O_EVENTS_N = 32;
    /// Tokens of the outputs among them (copied from `O_EVENTS + H_EV_CAP * EVENT_WORDS`
    /// unless `O_OVERFLOW`).
    O_TOKENS_N = 33;
    /// 1: the tokens did not fit; the events keep their arena offsets.
    O_OVERFLOW = 34;
    /// Σ generated tokens over the instances, low and high word.
    O_GEN_LO = 35;
    O_GEN_HI = 36;
    /// 1: an output's span reaches past the arena (a corrupt state).
    O_BAD = 37;
    O_EVENTS = 40;

    // ---- workgroups ----
    /// Invocations per workgroup of `vm_interpret` and `vm_advance` (one instance each).
    VM_LOCAL = 64;
    /// Invocations of `vm_plan`'s one workgroup (instances are scanned in blocks of this many).
    PLAN_LOCAL = 256;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// `const uint NAME = VALUEu;` lines of the GLSL mirror.
    fn glsl_constants(src: &str) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for line in src.lines() {
            let Some(rest) = line.trim().strip_prefix("const uint ") else {
                continue;
            };
            let (name, value) = rest
                .split_once('=')
                .unwrap_or_else(|| panic!("no `=` in `{line}`"));
            let value = value.trim().trim_end_matches(';').trim_end_matches('u');
            let value = match value.strip_prefix("0x") {
                Some(hex) => u32::from_str_radix(&hex.replace('_', ""), 16),
                None => value.parse(),
            }
            .unwrap_or_else(|e| panic!("`{line}`: {e}"));
            assert!(
                out.insert(name.trim().to_string(), value).is_none(),
                "`{}` twice in layout.glsl",
                name.trim()
            );
        }
        out
    }

    #[test]
    fn the_glsl_mirror_has_every_constant_with_the_same_value() {
        let glsl = glsl_constants(include_str!("../../shaders/agents/layout.glsl"));
        let rust: BTreeMap<String, u32> = ALL.iter().map(|&(n, v)| (n.to_string(), v)).collect();
        assert_eq!(rust.len(), ALL.len(), "a constant is defined twice");
        for (name, value) in &rust {
            assert_eq!(glsl.get(name), Some(value), "{name} in layout.glsl");
        }
        for name in glsl.keys() {
            assert!(rust.contains_key(name), "{name} is in layout.glsl only");
        }
    }

    #[test]
    fn record_fields_fit_their_records() {
        let check = |prefix: &str, words: u32| {
            for &(name, value) in ALL {
                if name.starts_with(prefix) && !name.ends_with("_WORDS") {
                    assert!(value < words, "{name} = {value} past {words} words");
                }
            }
        };
        check("H_", H_WORDS);
        check("I_", INST_WORDS);
        check("Q_", QUEUE_WORDS);
        check("TASK_", TASK_WORDS);
        check("B_", BOX_WORDS);
        check("S_", SLOT_WORDS);
        check("E_", EVENT_WORDS);
        check("PI_", PI_WORDS);
        const { assert!(I_REGS + N_REGS <= I_POS) };
    }
}
