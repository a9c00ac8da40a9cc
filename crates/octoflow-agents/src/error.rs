//! What can go wrong, in the order a program meets it: assembling the text ([`AsmError`]),
//! decoding words ([`DecodeError`]), starting a run ([`StartError`]), one instance's runtime
//! error ([`Fault`], which ends that instance only) and a step of the whole run ([`AgentError`]).

use octoflow_model::ModelError;

/// A program text the assembler refuses: the 1-based line and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {kind}")]
pub struct AsmError {
    pub line: usize,
    pub kind: AsmErrorKind,
}

/// Why the assembler refused a line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AsmErrorKind {
    #[error("unknown instruction `{0}`")]
    UnknownMnemonic(String),
    #[error("unknown directive `.{0}` (expected .const, .stop, .queue or .mailbox)")]
    UnknownDirective(String),
    #[error("`{op}` takes {expected} operand(s), found {found}")]
    OperandCount {
        op: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("operand {operand} of `{op}`: expected {expected}, found {found}")]
    WrongKind {
        op: &'static str,
        operand: usize,
        expected: &'static str,
        found: String,
    },
    #[error("register `{0}` does not exist (registers are r0..r15)")]
    BadRegister(String),
    #[error(
        "unknown special `%{0}` (known: %id %n %task %parent %tasks %max %rounds %len %finish \
         %pos %stop)"
    )]
    UnknownSpecial(String),
    #[error("`{0}` is not defined")]
    Undefined(String),
    #[error("`{name}` is already defined on line {first}")]
    Duplicate { name: String, first: usize },
    #[error("`{0}` cannot be a name: it reads as a register, a number or a special")]
    ReservedName(String),
    #[error("`{0}` is not a valid name (letters, digits, `_`, `.`; not starting with a digit)")]
    BadName(String),
    #[error("`{0}` is not a number (decimal or 0x hex, at most 4294967295)")]
    BadNumber(String),
    #[error("{0}")]
    BadString(String),
    #[error("{0}")]
    Syntax(String),
    #[error("constant `{0}` tokenizes to no tokens")]
    EmptyConst(String),
    #[error("stop set `{name}`: entry {entry} tokenizes to no tokens (it would match anywhere)")]
    EmptyStop { name: String, entry: usize },
    #[error("capacity `{0}`: expected positive integers and %n, %tasks, %rounds joined by `*`")]
    BadCapacity(String),
    #[error("slot {slot} is past mailbox `{name}`'s capacity of {cap}")]
    SlotPastCapacity { name: String, slot: u32, cap: u32 },
    #[error("waits for {count} messages but mailbox `{name}` holds at most {cap}")]
    WaitPastCapacity { name: String, count: u32, cap: u32 },
    #[error("`best` over the empty slot range {lo}..{hi}")]
    EmptyRange { lo: u32, hi: u32 },
    #[error("label `{0}` marks no instruction (nothing follows it)")]
    LabelPastEnd(String),
    #[error("the last instruction (`{0}`) can fall through the end of the program; end with `halt` or `jmp`")]
    FallsThrough(&'static str),
    #[error("the program has no instructions")]
    Empty,
    #[error("the program has {0} instructions, at most 4096 are allowed")]
    TooLong(usize),
}

/// Words that are not an instruction the interpreter can run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("unknown opcode {0}")]
    UnknownOp(u32),
    #[error("first word {0:#010x} has bits set above the operand kinds (bit 14 on)")]
    StrayBits(u32),
    #[error("operand {operand}: kind {kind} does not exist (0 immediate, 1 register, 2 special)")]
    BadKind { operand: usize, kind: u32 },
    #[error("operand {operand}: register {word} does not exist (registers are 0..15)")]
    BadRegister { operand: usize, word: u32 },
    #[error("operand {operand}: special {word} does not exist")]
    BadSpecial { operand: usize, word: u32 },
    #[error("operand {operand} of `{op}` must be {expected}")]
    WrongKind {
        op: &'static str,
        operand: usize,
        expected: &'static str,
    },
    #[error("`{op}` does not use operand {operand}, which must be immediate 0")]
    UnusedOperand { op: &'static str, operand: usize },
    #[error("{0} words do not make whole instructions (4 words each)")]
    Length(usize),
    #[error("instruction {pc}: {source}")]
    At { pc: usize, source: Box<DecodeError> },
}

/// A run that cannot start with this program, configuration, engine and tasks.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StartError {
    #[error("a run needs at least one instance")]
    NoInstances,
    #[error("{instances} instances need as many KV slots, but the engine holds {slots}")]
    TooManyInstances { instances: usize, slots: usize },
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("sampling parameters: {0}")]
    Sampling(String),
    #[error("{what} `{name}`: capacity `{expr}` is {value}, past the limit of {limit} (n = {n}, tasks = {tasks}, rounds = {rounds})")]
    Capacity {
        what: &'static str,
        name: String,
        expr: String,
        value: u64,
        limit: u64,
        n: usize,
        tasks: usize,
        rounds: usize,
    },
    #[error("{what} has token id {id}, outside the vocabulary (n_vocab = {n_vocab})")]
    TokenOutOfVocab {
        what: String,
        id: u32,
        n_vocab: usize,
    },
    #[error("the constants and tasks take {needed} arena tokens, but the arena holds {capacity}")]
    ArenaTooSmall { needed: u64, capacity: usize },
    #[error("{0} host tasks; at most 4294967294 fit the VM's u32 task indices")]
    TooManyTasks(usize),
}

/// A runtime error: it ends the instance that met it (state `error`), not the run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    #[error("division by zero")]
    DivByZero,
    #[error("slot {slot} of mailbox `{mailbox}` is already full")]
    SlotFull { mailbox: String, slot: u32 },
    #[error("slot {slot} of mailbox `{mailbox}` is empty")]
    SlotEmpty { mailbox: String, slot: u32 },
    #[error("slot {slot} is past mailbox `{mailbox}`'s capacity of {cap}")]
    SlotPastCapacity {
        mailbox: String,
        slot: u32,
        cap: u32,
    },
    #[error("waits for {count} messages but mailbox `{mailbox}` holds at most {cap}")]
    WaitPastCapacity {
        mailbox: String,
        count: u32,
        cap: u32,
    },
    #[error("`best` over the empty slot range {lo}..{hi} of mailbox `{mailbox}`")]
    EmptyRange { mailbox: String, lo: u32, hi: u32 },
    #[error("queue `{queue}` is full ({cap} tasks)")]
    QueueFull { queue: String, cap: u32 },
    #[error("queue `{queue}` is closed")]
    QueueClosed { queue: String },
    #[error("task {task} does not exist ({tasks} host tasks)")]
    TaskPastEnd { task: u32, tasks: u32 },
    #[error("no current task (no `take` or `task` ran yet)")]
    NoTask,
    #[error("no last span (no `gen` or `best` ran yet)")]
    NoSpan,
    #[error("arena full: {need} more tokens asked, {used} of {cap} taken")]
    ArenaFull { need: u64, used: u64, cap: u64 },
    #[error("context full: {need} more tokens after {pos} of {n_ctx} positions")]
    ContextFull { pos: u32, need: u64, n_ctx: u32 },
    #[error(
        "nothing to generate from (no presample and no pending token; append something first)"
    )]
    NothingToGenerate,
    #[error("the pc ran past the last instruction")]
    PastEnd,
    #[error("no progress: {0} instructions ran without feeding, generating or waiting")]
    NoProgress(usize),
}

/// A step of the run that failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("deadlock: every live instance waits for something that cannot come: {}", .0.join("; "))]
    Deadlock(Vec<String>),
    #[error("the engine has {0} steps in flight; a run needs it idle")]
    EngineBusy(usize),
    #[error(transparent)]
    Start(#[from] StartError),
    /// The GPU interpreter could not be set up or run.
    #[error("the GPU interpreter: {0}")]
    Gpu(String),
    #[error("the engine answered {found} for row {row}, which asked for {asked}")]
    EngineResult {
        row: usize,
        asked: &'static str,
        found: String,
    },
}
