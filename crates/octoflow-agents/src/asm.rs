//! The assembler: program text to a [`Program`].
//!
//! Two passes. The first reads every line — labels, directives (constants are tokenized here,
//! through the caller's tokenizer), instructions with their operand texts — and records every
//! name with its line, so names may be used before they are declared. The second resolves each
//! operand against its opcode's roles ([`Op::roles`]) and checks what can be checked before
//! the run: immediates against literal capacities, labels that mark nothing, a last instruction
//! that falls through, the length. Every error names its 1-based line.

use std::collections::HashMap;

use crate::error::{AsmError, AsmErrorKind};
use crate::isa::{Instr, Op, Operand, Role, Special, NO_STOP, N_REGS};
use crate::program::{Capacity, Factor, Named, Program, SourceLine, MAX_INSTRUCTIONS};

/// Turns text into token ids: without BOS, special tokens parsed (`"<|im_end|>"` is one id).
pub type Tokenize<'a> = &'a dyn Fn(&str) -> Vec<u32>;

/// Assembles `source`, tokenizing constants and stop strings with `tokenize`.
pub fn assemble(source: &str, tokenize: Tokenize<'_>) -> Result<Program, AsmError> {
    let mut asm = Assembler::default();
    asm.queues.push(Named {
        name: "tasks".into(),
        line: 0,
        value: Capacity(vec![Factor::Tasks]),
    });
    asm.names.insert("tasks".into(), (Kind::Queue, 0, 0));
    for (i, raw) in source.lines().enumerate() {
        let line = i + 1;
        asm.first_pass(line, raw, tokenize)
            .map_err(|kind| AsmError { line, kind })?;
    }
    asm.finish(source.lines().count().max(1))
}

/// What a name stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Const,
    Stop,
    Queue,
    Mailbox,
    Label,
}

impl Kind {
    fn role(self) -> Role {
        match self {
            Kind::Const => Role::Const,
            Kind::Stop => Role::Stop,
            Kind::Queue => Role::Queue,
            Kind::Mailbox => Role::Mailbox,
            Kind::Label => Role::Label,
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Const => "a constant",
            Kind::Stop => "a stop set",
            Kind::Queue => "a queue",
            Kind::Mailbox => "a mailbox",
            Kind::Label => "a label",
        }
    }
}

/// An instruction as read in the first pass, before its operands are resolved.
struct Pending {
    line: usize,
    op: Op,
    operands: Vec<String>,
    text: String,
}

#[derive(Default)]
struct Assembler {
    /// name → (kind, index in its table, line).
    names: HashMap<String, (Kind, u32, usize)>,
    pending: Vec<Pending>,
    consts: Vec<Named<Vec<u32>>>,
    stops: Vec<Named<Vec<Vec<u32>>>>,
    queues: Vec<Named<Capacity>>,
    mailboxes: Vec<Named<Capacity>>,
    labels: Vec<Named<u32>>,
}

type Res<T> = Result<T, AsmErrorKind>;

impl Assembler {
    fn first_pass(&mut self, line: usize, raw: &str, tokenize: Tokenize<'_>) -> Res<()> {
        let mut rest = strip_comment(raw)?.trim();
        // Labels: `name:` (several may precede one instruction).
        while let Some((head, tail)) = split_label(rest) {
            check_name(head)?;
            let pc = self.pending.len() as u32;
            self.declare(head, Kind::Label, self.labels.len() as u32, line)?;
            self.labels.push(Named {
                name: head.into(),
                line,
                value: pc,
            });
            rest = tail.trim_start();
        }
        if rest.is_empty() {
            return Ok(());
        }
        if let Some(directive) = rest.strip_prefix('.') {
            return self.directive(line, directive, tokenize);
        }
        let (mnemonic, args) = split_word(rest);
        let op = Op::from_mnemonic(mnemonic)
            .ok_or_else(|| AsmErrorKind::UnknownMnemonic(mnemonic.into()))?;
        let operands: Vec<String> = if args.trim().is_empty() {
            Vec::new()
        } else {
            args.split(',').map(|s| s.trim().to_string()).collect()
        };
        if operands.len() != op.roles().len() || operands.iter().any(|s| s.is_empty()) {
            if operands.len() == op.roles().len() {
                return Err(AsmErrorKind::Syntax(format!(
                    "`{mnemonic}`: an operand is missing between commas"
                )));
            }
            return Err(AsmErrorKind::OperandCount {
                op: op.mnemonic(),
                expected: op.roles().len(),
                found: operands.len(),
            });
        }
        self.pending.push(Pending {
            line,
            op,
            operands,
            text: rest.split_whitespace().collect::<Vec<_>>().join(" "),
        });
        Ok(())
    }

    fn declare(&mut self, name: &str, kind: Kind, index: u32, line: usize) -> Res<()> {
        if let Some(&(_, _, first)) = self.names.get(name) {
            return Err(if first == 0 {
                AsmErrorKind::Syntax(format!("`{name}` is the built-in queue of host tasks"))
            } else {
                AsmErrorKind::Duplicate {
                    name: name.into(),
                    first,
                }
            });
        }
        self.names.insert(name.into(), (kind, index, line));
        Ok(())
    }

    fn directive(&mut self, line: usize, text: &str, tokenize: Tokenize<'_>) -> Res<()> {
        let (word, args) = split_word(text);
        let (name, value) = split_word(args.trim_start());
        let value = value.trim();
        let known = matches!(word, "const" | "stop" | "queue" | "mailbox");
        if !known {
            return Err(AsmErrorKind::UnknownDirective(word.into()));
        }
        if name.is_empty() {
            return Err(AsmErrorKind::Syntax(format!(".{word} needs a name")));
        }
        check_name(name)?;
        if value.is_empty() {
            return Err(AsmErrorKind::Syntax(format!(
                ".{word} {name} needs a value"
            )));
        }
        match word {
            "const" => {
                let (text, rest) = parse_string(value)?;
                if !rest.trim().is_empty() {
                    return Err(AsmErrorKind::Syntax(format!(
                        "unexpected `{}` after the constant's string",
                        rest.trim()
                    )));
                }
                let tokens = tokenize(&text);
                if tokens.is_empty() {
                    return Err(AsmErrorKind::EmptyConst(name.into()));
                }
                self.declare(name, Kind::Const, self.consts.len() as u32, line)?;
                self.consts.push(Named {
                    name: name.into(),
                    line,
                    value: tokens,
                });
            }
            "stop" => {
                let seqs = parse_stop_entries(name, value, tokenize)?;
                self.declare(name, Kind::Stop, self.stops.len() as u32, line)?;
                self.stops.push(Named {
                    name: name.into(),
                    line,
                    value: seqs,
                });
            }
            _ => {
                let cap = parse_capacity(value)?;
                let (kind, table) = if word == "queue" {
                    (Kind::Queue, &mut self.queues)
                } else {
                    (Kind::Mailbox, &mut self.mailboxes)
                };
                let index = table.len() as u32;
                table.push(Named {
                    name: name.into(),
                    line,
                    value: cap,
                });
                self.declare(name, kind, index, line)?;
            }
        }
        Ok(())
    }

    /// The second pass and the whole-program checks.
    fn finish(self, n_lines: usize) -> Result<Program, AsmError> {
        if let Some(l) = self
            .labels
            .iter()
            .find(|l| l.value as usize == self.pending.len())
        {
            return Err(AsmError {
                line: l.line,
                kind: AsmErrorKind::LabelPastEnd(l.name.clone()),
            });
        }
        let Some(last) = self.pending.last() else {
            return Err(AsmError {
                line: n_lines,
                kind: AsmErrorKind::Empty,
            });
        };
        if self.pending.len() > MAX_INSTRUCTIONS {
            return Err(AsmError {
                line: self.pending[MAX_INSTRUCTIONS].line,
                kind: AsmErrorKind::TooLong(self.pending.len()),
            });
        }
        if last.op.falls_through() {
            return Err(AsmError {
                line: last.line,
                kind: AsmErrorKind::FallsThrough(last.op.mnemonic()),
            });
        }
        let mut instrs = Vec::with_capacity(self.pending.len());
        for p in &self.pending {
            let instr = self
                .resolve(p)
                .map_err(|kind| AsmError { line: p.line, kind })?;
            instrs.push(instr);
        }
        Ok(Program {
            instrs,
            lines: self
                .pending
                .iter()
                .map(|p| SourceLine {
                    line: p.line,
                    text: p.text.clone(),
                })
                .collect(),
            consts: self.consts,
            stops: self.stops,
            queues: self.queues,
            mailboxes: self.mailboxes,
            labels: self.labels,
        })
    }

    fn resolve(&self, p: &Pending) -> Res<Instr> {
        let mut operands = Vec::with_capacity(3);
        for (i, (text, &role)) in p.operands.iter().zip(p.op.roles()).enumerate() {
            operands.push(self.operand(p.op, i + 1, text, role)?);
        }
        let instr = Instr::new(p.op, &operands);
        self.check_capacities(&instr)?;
        Ok(instr)
    }

    fn operand(&self, op: Op, index: usize, text: &str, role: Role) -> Res<Operand> {
        let wrong = || AsmErrorKind::WrongKind {
            op: op.mnemonic(),
            operand: index,
            expected: role.describe(),
            found: format!("`{text}`"),
        };
        if text == "-" {
            return if role == Role::Stop {
                Ok(Operand::Imm(NO_STOP))
            } else {
                Err(wrong())
            };
        }
        if let Some(reg) = parse_register(text)? {
            return if matches!(role, Role::Value | Role::Dest) {
                Ok(Operand::Reg(reg))
            } else {
                Err(wrong())
            };
        }
        if let Some(name) = text.strip_prefix('%') {
            let s = Special::from_name(name)
                .ok_or_else(|| AsmErrorKind::UnknownSpecial(name.into()))?;
            return if role == Role::Value {
                Ok(Operand::Special(s))
            } else {
                Err(wrong())
            };
        }
        if text.starts_with(|c: char| c.is_ascii_digit()) {
            let v = parse_number(text)?;
            return if role == Role::Value {
                Ok(Operand::Imm(v))
            } else {
                Err(wrong())
            };
        }
        check_name(text)?;
        let &(kind, idx, _) = self
            .names
            .get(text)
            .ok_or_else(|| AsmErrorKind::Undefined(text.into()))?;
        if kind.role() != role {
            return Err(AsmErrorKind::WrongKind {
                op: op.mnemonic(),
                operand: index,
                expected: role.describe(),
                found: format!("`{text}` ({})", kind.noun()),
            });
        }
        Ok(Operand::Imm(match kind {
            Kind::Label => self.labels[idx as usize].value,
            _ => idx,
        }))
    }

    /// Immediate slots and counts against a mailbox's literal capacity.
    fn check_capacities(&self, instr: &Instr) -> Res<()> {
        let imm = |o: Operand| match o {
            Operand::Imm(v) => Some(v),
            _ => None,
        };
        let mailbox = |o: Operand| {
            let i = imm(o).unwrap_or(0) as usize;
            let m = &self.mailboxes[i];
            (m.name.clone(), m.value.constant())
        };
        match instr.op {
            Op::Send | Op::AppendMsg => {
                let (name, cap) = mailbox(instr.a);
                if let (Some(cap), Some(slot)) = (cap, imm(instr.b)) {
                    if slot >= cap {
                        return Err(AsmErrorKind::SlotPastCapacity { name, slot, cap });
                    }
                }
            }
            Op::Wait => {
                let (name, cap) = mailbox(instr.a);
                if let (Some(cap), Some(count)) = (cap, imm(instr.b)) {
                    if count > cap {
                        return Err(AsmErrorKind::WaitPastCapacity { name, count, cap });
                    }
                }
            }
            Op::Best => {
                let (name, cap) = mailbox(instr.a);
                if let (Some(lo), Some(hi)) = (imm(instr.b), imm(instr.c)) {
                    if lo >= hi {
                        return Err(AsmErrorKind::EmptyRange { lo, hi });
                    }
                }
                if let (Some(cap), Some(hi)) = (cap, imm(instr.c)) {
                    if hi > cap {
                        let slot = hi - 1;
                        return Err(AsmErrorKind::SlotPastCapacity { name, slot, cap });
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// The line without its comment (`;` or `#` outside a string).
fn strip_comment(raw: &str) -> Res<&str> {
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in raw.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            ';' | '#' if !in_string => return Ok(&raw[..i]),
            _ => {}
        }
    }
    Ok(raw)
}

/// `name: rest` → `(name, rest)` when the line starts with a label.
fn split_label(s: &str) -> Option<(&str, &str)> {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))?;
    if end > 0 && s[end..].starts_with(':') {
        Some((&s[..end], &s[end + 1..]))
    } else {
        None
    }
}

/// The first whitespace-separated word and the rest.
fn split_word(s: &str) -> (&str, &str) {
    match s.find(char::is_whitespace) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

fn check_name(name: &str) -> Res<()> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
        return Err(AsmErrorKind::BadName(name.into()));
    }
    if !matches!(parse_register(name), Ok(None)) {
        return Err(AsmErrorKind::ReservedName(name.into()));
    }
    Ok(())
}

/// `rN` → `Some(N)`; `rN` past `r15` → an error; anything else → `None`.
fn parse_register(text: &str) -> Res<Option<u8>> {
    let Some(digits) = text.strip_prefix('r') else {
        return Ok(None);
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(None);
    }
    match digits.parse::<usize>() {
        Ok(n) if n < N_REGS => Ok(Some(n as u8)),
        _ => Err(AsmErrorKind::BadRegister(text.into())),
    }
}

fn parse_number(text: &str) -> Res<u32> {
    let parsed = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse::<u32>(),
    };
    parsed.map_err(|_| AsmErrorKind::BadNumber(text.into()))
}

/// A `"..."` literal at the start of `s` (escapes `\n \t \r \0 \\ \"`): its text and the rest.
fn parse_string(s: &str) -> Res<(String, &str)> {
    let Some(body) = s.strip_prefix('"') else {
        return Err(AsmErrorKind::BadString(format!(
            "expected a string in double quotes, found `{s}`"
        )));
    };
    let mut out = String::new();
    let mut chars = body.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Ok((out, &body[i + 1..])),
            '\\' => {
                let e = chars.next().map(|(_, e)| e);
                out.push(match e {
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some('r') => '\r',
                    Some('0') => '\0',
                    Some('\\') => '\\',
                    Some('"') => '"',
                    other => {
                        return Err(AsmErrorKind::BadString(format!(
                            "unknown escape `\\{}` (known: \\n \\t \\r \\0 \\\\ \\\")",
                            other.map(String::from).unwrap_or_default()
                        )))
                    }
                });
            }
            c => out.push(c),
        }
    }
    Err(AsmErrorKind::BadString("unterminated string".into()))
}

/// `"text", "text2", 17`: token sequences from strings, single ids from integers.
fn parse_stop_entries(name: &str, mut s: &str, tokenize: Tokenize<'_>) -> Res<Vec<Vec<u32>>> {
    let mut seqs = Vec::new();
    loop {
        s = s.trim_start();
        let seq = if s.starts_with('"') {
            let (text, rest) = parse_string(s)?;
            s = rest;
            tokenize(&text)
        } else {
            let end = s.find(',').unwrap_or(s.len());
            let v = parse_number(s[..end].trim())?;
            s = &s[end..];
            vec![v]
        };
        if seq.is_empty() {
            return Err(AsmErrorKind::EmptyStop {
                name: name.into(),
                entry: seqs.len(),
            });
        }
        seqs.push(seq);
        s = s.trim_start();
        if s.is_empty() {
            return Ok(seqs);
        }
        s = s.strip_prefix(',').ok_or_else(|| {
            AsmErrorKind::Syntax(format!("expected `,` between stop entries, found `{s}`"))
        })?;
    }
}

fn parse_capacity(text: &str) -> Res<Capacity> {
    let bad = || AsmErrorKind::BadCapacity(text.into());
    let mut factors = Vec::new();
    for part in text.split('*') {
        let part = part.trim();
        factors.push(match part {
            "%n" => Factor::N,
            "%tasks" => Factor::Tasks,
            "%rounds" => Factor::Rounds,
            _ if part.starts_with(|c: char| c.is_ascii_digit()) => {
                match parse_number(part).map_err(|_| bad())? {
                    0 => return Err(bad()),
                    v => Factor::Int(v),
                }
            }
            _ => return Err(bad()),
        });
    }
    Ok(Capacity(factors))
}

#[cfg(test)]
#[path = "asm_tests.rs"]
mod tests;
