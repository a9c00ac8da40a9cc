//! The instruction set: opcodes, operands, and the four-word encoding the GPU interpreter reads.
//!
//! An instruction is four u32 words (docs/VM.md, "Encoding"):
//! `op | kind(a) << 8 | kind(b) << 10 | kind(c) << 12`, then operands `a`, `b`, `c`. Kinds: 0
//! immediate, 1 register, 2 special. Names (labels, constants, stop sets, queues, mailboxes) are
//! immediates holding their index; an operand an opcode does not use is immediate 0.
//!
//! Each opcode has a fixed signature of operand *roles* ([`Role`]): a role says which kinds may
//! fill it, so [`Instr::decode`] refuses words the interpreter could not run (a label held in a
//! register, a register past `r15`), and the assembler and the decoder agree on one table.

use std::fmt;

use crate::error::DecodeError;

/// Registers per instance (`r0`..`r15`).
pub const N_REGS: usize = 16;

/// Words per encoded instruction.
pub const WORDS: usize = 4;

/// The stop-set operand of `gen n, -`: end-of-generation tokens only.
pub const NO_STOP: u32 = u32::MAX;

/// `%task` and `%parent` before the first `take` or `task`.
pub const NO_TASK: u32 = u32::MAX;

/// What an operand slot of an opcode holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A value read at run time: immediate, register or special.
    Value,
    /// A register written by the instruction.
    Dest,
    /// An instruction index (immediate).
    Label,
    /// A constant's index (immediate).
    Const,
    /// A stop set's index, or [`NO_STOP`] (immediate).
    Stop,
    /// A queue's index (immediate).
    Queue,
    /// A mailbox's index (immediate).
    Mailbox,
}

impl Role {
    /// How the role reads in an error message.
    pub fn describe(self) -> &'static str {
        match self {
            Role::Value => "a value (number, register or special)",
            Role::Dest => "a register",
            Role::Label => "a label",
            Role::Const => "a constant",
            Role::Stop => "a stop set (or -)",
            Role::Queue => "a queue",
            Role::Mailbox => "a mailbox",
        }
    }
}

macro_rules! opcodes {
    ($($variant:ident = $code:literal, $mnemonic:literal, [$($role:ident),*];)*) => {
        /// An opcode; the discriminant is its encoding.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Op {
            $($variant = $code,)*
        }

        impl Op {
            /// Every opcode, in encoding order.
            pub const ALL: &'static [Op] = &[$(Op::$variant,)*];

            /// The opcode of an encoding.
            pub fn from_code(code: u8) -> Option<Op> {
                match code {
                    $($code => Some(Op::$variant),)*
                    _ => None,
                }
            }

            /// The opcode written as `mnemonic`.
            pub fn from_mnemonic(mnemonic: &str) -> Option<Op> {
                match mnemonic {
                    $($mnemonic => Some(Op::$variant),)*
                    _ => None,
                }
            }

            /// How the assembler writes it.
            pub fn mnemonic(self) -> &'static str {
                match self {
                    $(Op::$variant => $mnemonic,)*
                }
            }

            /// The roles of its operands, in order (at most three).
            pub fn roles(self) -> &'static [Role] {
                match self {
                    $(Op::$variant => &[$(Role::$role),*],)*
                }
            }
        }
    };
}

opcodes! {
    Halt = 0, "halt", [];
    Set = 1, "set", [Dest, Value];
    Add = 2, "add", [Dest, Value, Value];
    Sub = 3, "sub", [Dest, Value, Value];
    Mul = 4, "mul", [Dest, Value, Value];
    Div = 5, "div", [Dest, Value, Value];
    Rem = 6, "rem", [Dest, Value, Value];
    Jmp = 7, "jmp", [Label];
    Beq = 8, "beq", [Value, Value, Label];
    Bne = 9, "bne", [Value, Value, Label];
    Blt = 10, "blt", [Value, Value, Label];
    Bge = 11, "bge", [Value, Value, Label];
    AppendTask = 12, "append.task", [];
    AppendConst = 13, "append.const", [Const];
    AppendLast = 14, "append.last", [];
    AppendMsg = 15, "append.msg", [Mailbox, Value];
    Gen = 16, "gen", [Value, Stop];
    Send = 17, "send", [Mailbox, Value];
    Wait = 18, "wait", [Mailbox, Value];
    Best = 19, "best", [Mailbox, Value, Value];
    Take = 20, "take", [Queue, Label];
    Task = 21, "task", [Value];
    Push = 22, "push", [Queue, Dest];
    Close = 23, "close", [Queue];
    Emit = 24, "emit", [Value];
    Reset = 25, "reset", [];
    Seed = 26, "seed", [Value];
}

impl Op {
    /// Whether execution can continue at the next instruction (every opcode but `halt` and
    /// `jmp`), which is what a program's last instruction must not do.
    pub fn falls_through(self) -> bool {
        !matches!(self, Op::Halt | Op::Jmp)
    }
}

macro_rules! specials {
    ($($variant:ident = $code:literal, $name:literal, $doc:literal;)*) => {
        /// A read-only value of the instance or the run (`%name`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Special {
            $(#[doc = $doc] $variant = $code,)*
        }

        impl Special {
            /// Every special, in encoding order.
            pub const ALL: &'static [Special] = &[$(Special::$variant,)*];

            /// The special of an encoding.
            pub fn from_code(code: u32) -> Option<Special> {
                match code {
                    $($code => Some(Special::$variant),)*
                    _ => None,
                }
            }

            /// The special written `%name` (without the `%`).
            pub fn from_name(name: &str) -> Option<Special> {
                match name {
                    $($name => Some(Special::$variant),)*
                    _ => None,
                }
            }

            /// Its name, without the `%`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Special::$variant => $name,)*
                }
            }
        }
    };
}

specials! {
    Id = 0, "id", "This instance's index, `0..%n`.";
    N = 1, "n", "Instances in the run.";
    Task = 2, "task", "Index of the current task in the queue it came from ([`NO_TASK`] before one).";
    Parent = 3, "parent", "Index of the host task the current task descends from.";
    Tasks = 4, "tasks", "Tasks in queue 0 (the host's).";
    Max = 5, "max", "The run's token limit.";
    Rounds = 6, "rounds", "The run's rounds.";
    Len = 7, "len", "Tokens of the last span, after trimming its stop match.";
    Finish = 8, "finish", "The last span's finish: 0 none, 1 stop, 2 length.";
    Pos = 9, "pos", "Tokens in the context, a pending one included.";
    Stop = 10, "stop", "Which stop ended the last span: 0 none, 1 an end-of-generation token, 2 + k the stop set's sequence k.";
}

/// One operand as encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operand {
    /// Kind 0: a number, or the index of a name.
    Imm(u32),
    /// Kind 1: `r0`..`r15`.
    Reg(u8),
    /// Kind 2: `%name`.
    Special(Special),
}

impl Operand {
    /// The kind field of the encoding.
    pub fn kind(self) -> u32 {
        match self {
            Operand::Imm(_) => 0,
            Operand::Reg(_) => 1,
            Operand::Special(_) => 2,
        }
    }

    /// The operand word of the encoding.
    pub fn word(self) -> u32 {
        match self {
            Operand::Imm(v) => v,
            Operand::Reg(r) => r as u32,
            Operand::Special(s) => s as u32,
        }
    }

    /// Whether `role` may hold this operand.
    pub fn fits(self, role: Role) -> bool {
        match role {
            Role::Value => true,
            Role::Dest => matches!(self, Operand::Reg(_)),
            _ => matches!(self, Operand::Imm(_)),
        }
    }
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Operand::Imm(v) => write!(f, "{v}"),
            Operand::Reg(r) => write!(f, "r{r}"),
            Operand::Special(s) => write!(f, "%{}", s.name()),
        }
    }
}

/// One decoded instruction: the opcode and its three operand slots (unused ones `Imm(0)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Instr {
    pub op: Op,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
}

impl Instr {
    /// An instruction from its opcode and used operands (the rest become `Imm(0)`).
    ///
    /// The caller (the assembler) has checked `operands` against [`Op::roles`].
    pub fn new(op: Op, operands: &[Operand]) -> Self {
        let get = |i: usize| operands.get(i).copied().unwrap_or(Operand::Imm(0));
        Instr {
            op,
            a: get(0),
            b: get(1),
            c: get(2),
        }
    }

    /// The three operand slots in order.
    pub fn operands(&self) -> [Operand; 3] {
        [self.a, self.b, self.c]
    }

    /// The four words the GPU interpreter reads.
    pub fn encode(&self) -> [u32; WORDS] {
        [
            self.op as u32 | self.a.kind() << 8 | self.b.kind() << 10 | self.c.kind() << 12,
            self.a.word(),
            self.b.word(),
            self.c.word(),
        ]
    }

    /// The instruction four words encode, refusing anything the interpreter could not run:
    /// an unknown opcode, bits above the kind fields, a kind 3, a register past `r15`, an unknown
    /// special, an operand whose kind its role does not allow, an unused operand that is not
    /// immediate 0.
    pub fn decode(words: [u32; WORDS]) -> Result<Instr, DecodeError> {
        let head = words[0];
        let op = Op::from_code((head & 0xff) as u8).ok_or(DecodeError::UnknownOp(head & 0xff))?;
        if head >> 14 != 0 {
            return Err(DecodeError::StrayBits(head));
        }
        let roles = op.roles();
        let mut operands = [Operand::Imm(0); 3];
        for (i, slot) in operands.iter_mut().enumerate() {
            let kind = (head >> (8 + 2 * i)) & 3;
            let word = words[1 + i];
            let operand = match kind {
                0 => Operand::Imm(word),
                1 if (word as usize) < N_REGS => Operand::Reg(word as u8),
                1 => return Err(DecodeError::BadRegister { operand: i, word }),
                2 => Operand::Special(
                    Special::from_code(word).ok_or(DecodeError::BadSpecial { operand: i, word })?,
                ),
                _ => return Err(DecodeError::BadKind { operand: i, kind }),
            };
            match roles.get(i) {
                Some(&role) if !operand.fits(role) => {
                    return Err(DecodeError::WrongKind {
                        op: op.mnemonic(),
                        operand: i,
                        expected: role.describe(),
                    })
                }
                None if operand != Operand::Imm(0) => {
                    return Err(DecodeError::UnusedOperand {
                        op: op.mnemonic(),
                        operand: i,
                    })
                }
                _ => {}
            }
            *slot = operand;
        }
        Ok(Instr {
            op,
            a: operands[0],
            b: operands[1],
            c: operands[2],
        })
    }
}

/// Decodes a flat word array ([`crate::Program::words`]) instruction by instruction.
pub fn decode_words(words: &[u32]) -> Result<Vec<Instr>, DecodeError> {
    let chunks = words.chunks_exact(WORDS);
    if !chunks.remainder().is_empty() {
        return Err(DecodeError::Length(words.len()));
    }
    chunks
        .enumerate()
        .map(|(pc, w)| {
            Instr::decode([w[0], w[1], w[2], w[3]]).map_err(|e| DecodeError::At {
                pc,
                source: Box::new(e),
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "isa_tests.rs"]
mod tests;
