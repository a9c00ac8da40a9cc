//! An assembled program: instructions with their source lines, and the tables its names index
//! (constants, stop sets, queues, mailboxes, labels).

use std::fmt;

use crate::isa::{Instr, WORDS};

/// Most instructions in a program (docs/VM.md, "Validation").
pub const MAX_INSTRUCTIONS: usize = 4096;

/// A factor of a capacity expression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Factor {
    Int(u32),
    /// `%n`: instances in the run.
    N,
    /// `%tasks`: host tasks.
    Tasks,
    /// `%rounds`: the run's rounds.
    Rounds,
}

/// A queue's or mailbox's capacity: a product of [`Factor`]s, evaluated when the run starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity(pub Vec<Factor>);

/// The numbers a capacity expression reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityEnv {
    pub n: usize,
    pub tasks: usize,
    pub rounds: usize,
}

impl Capacity {
    /// The product, in u64 (saturating: the caller compares it with a limit far below).
    pub fn eval(&self, env: CapacityEnv) -> u64 {
        self.0.iter().fold(1u64, |acc, f| {
            let v = match *f {
                Factor::Int(v) => v as u64,
                Factor::N => env.n as u64,
                Factor::Tasks => env.tasks as u64,
                Factor::Rounds => env.rounds as u64,
            };
            acc.saturating_mul(v)
        })
    }

    /// The value when it has no specials (what the assembler can check immediates against).
    pub fn constant(&self) -> Option<u32> {
        let mut acc = 1u64;
        for f in &self.0 {
            match *f {
                Factor::Int(v) => acc = acc.saturating_mul(v as u64),
                _ => return None,
            }
        }
        u32::try_from(acc).ok()
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, factor) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("*")?;
            }
            match factor {
                Factor::Int(v) => write!(f, "{v}")?,
                Factor::N => f.write_str("%n")?,
                Factor::Tasks => f.write_str("%tasks")?,
                Factor::Rounds => f.write_str("%rounds")?,
            }
        }
        Ok(())
    }
}

/// A declared name and what it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named<T> {
    pub name: String,
    /// The 1-based line of the declaration (0: built in, like queue `tasks`).
    pub line: usize,
    pub value: T,
}

/// Where an instruction came from, for runtime error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceLine {
    /// 1-based.
    pub line: usize,
    /// The instruction as written, comments and label stripped.
    pub text: String,
}

/// An assembled program ([`crate::assemble`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub(crate) instrs: Vec<Instr>,
    pub(crate) lines: Vec<SourceLine>,
    pub(crate) consts: Vec<Named<Vec<u32>>>,
    /// Each stop set's token sequences, in declaration order (`%stop` = 2 + index).
    pub(crate) stops: Vec<Named<Vec<Vec<u32>>>>,
    /// Queue 0 is `tasks`, the host's (capacity `%tasks`).
    pub(crate) queues: Vec<Named<Capacity>>,
    pub(crate) mailboxes: Vec<Named<Capacity>>,
    pub(crate) labels: Vec<Named<u32>>,
}

impl Program {
    /// The instructions, in program order (`pc` indexes them).
    pub fn instructions(&self) -> &[Instr] {
        &self.instrs
    }

    /// The source line of instruction `pc`.
    pub fn source_line(&self, pc: usize) -> Option<&SourceLine> {
        self.lines.get(pc)
    }

    /// The constants' token ids.
    pub fn consts(&self) -> &[Named<Vec<u32>>] {
        &self.consts
    }

    /// The stop sets' token sequences.
    pub fn stops(&self) -> &[Named<Vec<Vec<u32>>>] {
        &self.stops
    }

    /// The queues (`tasks` first).
    pub fn queues(&self) -> &[Named<Capacity>] {
        &self.queues
    }

    /// The mailboxes.
    pub fn mailboxes(&self) -> &[Named<Capacity>] {
        &self.mailboxes
    }

    /// The labels and the instruction each marks.
    pub fn labels(&self) -> &[Named<u32>] {
        &self.labels
    }

    /// The flat encoding the GPU interpreter reads: [`WORDS`] u32 per instruction.
    pub fn words(&self) -> Vec<u32> {
        let mut words = Vec::with_capacity(self.instrs.len() * WORDS);
        for instr in &self.instrs {
            words.extend_from_slice(&instr.encode());
        }
        words
    }

    /// Whether some instruction is `op` (a run that never reads scores may sample on the
    /// device).
    pub fn uses(&self, op: crate::isa::Op) -> bool {
        self.instrs.iter().any(|i| i.op == op)
    }

    /// `pc N (line L: `text`)`, for runtime error messages.
    pub fn locate(&self, pc: usize) -> String {
        match self.lines.get(pc) {
            Some(s) => format!("pc {pc} (line {}: `{}`)", s.line, s.text),
            None => format!("pc {pc} (past the end)"),
        }
    }
}
