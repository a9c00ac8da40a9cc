//! The interpret phase: an instance executes instructions until one yields (docs/VM.md, "A
//! step", phase 1).
//!
//! Instructions that neither feed nor wait run at once; `append.*` and `gen` hand the instance
//! to the planner (state `feed` / `gen`), a `wait` or `take` that cannot proceed leaves it at
//! the same pc (state `wait`), and at most [`BUDGET`] instructions run per phase.

use octoflow_core::Finish;

use crate::error::Fault;
use crate::event::Event;
use crate::isa::{Instr, Op, Operand, Special, NO_TASK};
use crate::memory::{Memory, Message, Span, Take, Task};
use crate::program::Program;
use crate::state::{Feed, GenState, Instance, Status, Waiting};

/// Most instructions an instance executes in one interpret phase.
pub const BUDGET: usize = 4096;

/// What the run fixes for every instance: the specials that do not change, and the context.
#[derive(Debug, Clone)]
pub struct Env {
    pub n: u32,
    pub tasks: u32,
    pub max: u32,
    pub rounds: u32,
    pub seed: u64,
    pub n_ctx: u32,
    pub eog: Vec<u32>,
}

/// Everything an instruction may touch besides its instance.
pub struct Ctx<'a> {
    pub program: &'a Program,
    pub mem: &'a mut Memory,
    pub env: &'a Env,
    /// The step being run (visibility: what was written at `now` is not read at `now`).
    pub now: u64,
    pub events: &'a mut Vec<Event>,
}

/// How execution goes on after one instruction.
enum Flow {
    Next,
    Jump(u32),
    /// The instance now feeds or generates; the pc moves past the instruction.
    Yield,
    /// A `wait` or `take` that cannot proceed: why.
    Block(Waiting),
    Halt,
}

/// Runs `inst` (state `run` or `wait`) until it yields; returns whether anything changed
/// (an instruction completed, the instance halted or failed).
pub fn interpret(inst: &mut Instance, cx: &mut Ctx<'_>) -> bool {
    inst.status = Status::Run;
    let mut changed = false;
    for _ in 0..BUDGET {
        let pc = inst.pc;
        let Some(&instr) = cx.program.instrs.get(pc as usize) else {
            fail(inst, cx, Fault::PastEnd);
            return true;
        };
        if instr.op != Op::Gen {
            // Only a `gen` that comes right after the append may take its presample.
            inst.presample = None;
        }
        match exec(inst, instr, cx) {
            Ok(Flow::Next) => inst.pc += 1,
            Ok(Flow::Jump(target)) => inst.pc = target,
            Ok(Flow::Yield) => {
                inst.pc += 1;
                return true;
            }
            Ok(Flow::Block(why)) => {
                inst.status = Status::Wait;
                inst.waiting = why;
                return changed;
            }
            Ok(Flow::Halt) => {
                inst.status = Status::Halted;
                return true;
            }
            Err(fault) => {
                fail(inst, cx, fault);
                return true;
            }
        }
        changed = true;
    }
    fail(inst, cx, Fault::NoProgress(BUDGET));
    true
}

/// Ends `inst` with a runtime error event naming the pc and source line.
pub fn fail(inst: &mut Instance, cx: &mut Ctx<'_>, fault: Fault) {
    inst.status = Status::Error;
    cx.events.push(Event::Error {
        instance: inst.id,
        message: format!(
            "instance {}, {}: {fault}",
            inst.id,
            cx.program.locate(inst.pc as usize)
        ),
    });
}

fn value(inst: &Instance, env: &Env, o: Operand) -> u32 {
    match o {
        Operand::Imm(v) => v,
        Operand::Reg(r) => inst.regs[r as usize],
        Operand::Special(s) => match s {
            Special::Id => inst.id,
            Special::N => env.n,
            Special::Task => inst.task,
            Special::Parent => inst.parent,
            Special::Tasks => env.tasks,
            Special::Max => env.max,
            Special::Rounds => env.rounds,
            Special::Len => inst.last.map_or(0, |s| s.len),
            Special::Finish => inst.last.map_or(0, |s| s.finish_code()),
            Special::Pos => inst.context_len(),
            Special::Stop => inst.last.map_or(0, |s| s.stop),
        },
    }
}

fn reg(o: Operand) -> usize {
    match o {
        Operand::Reg(r) => r as usize,
        // The assembler and the decoder only let registers fill a destination.
        _ => 0,
    }
}

fn imm(o: Operand) -> u32 {
    match o {
        Operand::Imm(v) => v,
        _ => 0,
    }
}

fn exec(inst: &mut Instance, instr: Instr, cx: &mut Ctx<'_>) -> Result<Flow, Fault> {
    let env = cx.env;
    let v = |inst: &Instance, o| value(inst, env, o);
    let now = cx.now;
    match instr.op {
        Op::Halt => return Ok(Flow::Halt),
        Op::Set => inst.regs[reg(instr.a)] = v(inst, instr.b),
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Rem => {
            let (x, y) = (v(inst, instr.b), v(inst, instr.c));
            inst.regs[reg(instr.a)] = match instr.op {
                Op::Add => x.wrapping_add(y),
                Op::Sub => x.wrapping_sub(y),
                Op::Mul => x.wrapping_mul(y),
                _ if y == 0 => return Err(Fault::DivByZero),
                Op::Div => x / y,
                _ => x % y,
            };
        }
        Op::Jmp => return Ok(Flow::Jump(imm(instr.a))),
        Op::Beq | Op::Bne | Op::Blt | Op::Bge => {
            let (x, y) = (v(inst, instr.a), v(inst, instr.b));
            let taken = match instr.op {
                Op::Beq => x == y,
                Op::Bne => x != y,
                Op::Blt => x < y,
                _ => x >= y,
            };
            if taken {
                return Ok(Flow::Jump(imm(instr.c)));
            }
        }
        Op::AppendTask => {
            let (offset, len) = inst.task_span.ok_or(Fault::NoTask)?;
            return start_append(inst, env, offset, len);
        }
        Op::AppendConst => {
            let (offset, len) = cx.mem.consts[imm(instr.a) as usize];
            return start_append(inst, env, offset, len);
        }
        Op::AppendLast => {
            let span = inst.last.ok_or(Fault::NoSpan)?;
            return start_append(inst, env, span.offset, span.len);
        }
        Op::AppendMsg => {
            let slot = v(inst, instr.b);
            let m = cx.mem.mailboxes[imm(instr.a) as usize].read(slot, now)?;
            return start_append(inst, env, m.span.offset, m.span.len);
        }
        Op::Gen => return start_gen(inst, cx, v(inst, instr.a), imm(instr.b)),
        Op::Send => {
            let span = inst.last.ok_or(Fault::NoSpan)?;
            let message = Message {
                span,
                sender: inst.id,
                parent: inst.parent,
            };
            let slot = v(inst, instr.b);
            cx.mem.mailboxes[imm(instr.a) as usize].send(slot, message, now)?;
        }
        Op::Wait => {
            let b = &cx.mem.mailboxes[imm(instr.a) as usize];
            let count = v(inst, instr.b);
            if count > b.cap {
                return Err(Fault::WaitPastCapacity {
                    mailbox: b.name.clone(),
                    count,
                    cap: b.cap,
                });
            }
            let have = b.count(now);
            if have < count {
                return Ok(Flow::Block(Waiting::Mailbox {
                    mailbox: imm(instr.a),
                    have,
                    count,
                }));
            }
        }
        Op::Best => inst.last = Some(best(cx, instr, v(inst, instr.b), v(inst, instr.c))?),
        Op::Take => {
            let q = &mut cx.mem.queues[imm(instr.a) as usize];
            match q.take(now) {
                Take::Task(index, task) => set_task(inst, index, task),
                Take::Closed => return Ok(Flow::Jump(imm(instr.b))),
                Take::Empty => {
                    return Ok(Flow::Block(Waiting::Queue {
                        queue: imm(instr.a),
                        pushed: q.visible(now),
                        taken: q.taken(),
                    }))
                }
            }
        }
        Op::Task => {
            let index = v(inst, instr.a);
            let task = cx.mem.queues[0].get(index).ok_or(Fault::TaskPastEnd {
                task: index,
                tasks: env.tasks,
            })?;
            set_task(inst, index, task);
        }
        Op::Push => {
            let span = inst.last.ok_or(Fault::NoSpan)?;
            let task = Task {
                offset: span.offset,
                len: span.len,
                parent: inst.parent,
            };
            let index = cx.mem.queues[imm(instr.a) as usize].push(task, now, inst.id)?;
            inst.regs[reg(instr.b)] = index;
        }
        Op::Close => cx.mem.queues[imm(instr.a) as usize].close(now, inst.id),
        Op::Emit => {
            let span = inst.last.ok_or(Fault::NoSpan)?;
            cx.events.push(Event::Output {
                instance: inst.id,
                task: (inst.parent != NO_TASK).then_some(inst.parent),
                round: v(inst, instr.a),
                tokens: cx.mem.arena.get(span.offset, span.len).to_vec(),
                finish: span.finish,
                score: span.score,
            });
        }
        Op::Reset => {
            inst.pos = 0;
            inst.pending = None;
            inst.presample = None;
        }
        Op::Seed => {
            inst.seed = env.seed.wrapping_add(v(inst, instr.a) as u64);
            inst.draws = 0;
        }
    }
    Ok(Flow::Next)
}

fn set_task(inst: &mut Instance, index: u32, task: Task) {
    inst.task = index;
    inst.parent = task.parent;
    inst.task_span = Some((task.offset, task.len));
}

/// Starts feeding the pending token and `len` arena tokens at `offset`.
fn start_append(inst: &mut Instance, env: &Env, offset: u32, len: u32) -> Result<Flow, Fault> {
    let total = len as u64 + inst.pending.is_some() as u64;
    if total == 0 {
        return Ok(Flow::Next);
    }
    if inst.pos as u64 + total > env.n_ctx as u64 {
        return Err(Fault::ContextFull {
            pos: inst.context_len(),
            need: len as u64,
            n_ctx: env.n_ctx,
        });
    }
    inst.feed = Feed {
        first: inst.pending.take(),
        offset,
        len,
        cursor: 0,
    };
    inst.status = Status::Feed;
    Ok(Flow::Yield)
}

/// `gen limit, stop`: a new span; its first token is the presample if there is one.
fn start_gen(inst: &mut Instance, cx: &mut Ctx<'_>, limit: u32, stop: u32) -> Result<Flow, Fault> {
    let presample = inst.presample.take();
    if presample.is_none() && inst.pending.is_none() {
        return Err(Fault::NothingToGenerate);
    }
    let offset = cx.mem.arena.alloc(limit)?;
    inst.gen = GenState {
        limit,
        stop,
        logprob_sum: 0.0,
    };
    let mut span = Span {
        offset,
        len: 0,
        generated: 0,
        finish: None,
        stop: 0,
        score: f32::NEG_INFINITY,
    };
    let n_ctx = cx.env.n_ctx;
    let full = match presample {
        Some(_) => inst.pos >= n_ctx,
        None => inst.context_len() >= n_ctx,
    };
    if limit == 0 || full {
        span.finish = Some(if limit == 0 {
            Finish::Length
        } else {
            Finish::Context
        });
        inst.last = Some(span);
        return Ok(Flow::Next);
    }
    inst.last = Some(span);
    if let Some(p) = presample {
        let stops = &cx.mem.stops;
        if inst.accept(
            &mut cx.mem.arena,
            p.token,
            p.logprob,
            &cx.env.eog,
            stops,
            n_ctx,
        ) {
            return Ok(Flow::Next);
        }
    }
    inst.status = Status::Gen;
    Ok(Flow::Yield)
}

/// The message of slots `lo..hi` with the highest score (ties: the lowest slot).
fn best(cx: &Ctx<'_>, instr: Instr, lo: u32, hi: u32) -> Result<Span, Fault> {
    let b = &cx.mem.mailboxes[imm(instr.a) as usize];
    if lo >= hi {
        return Err(Fault::EmptyRange {
            mailbox: b.name.clone(),
            lo,
            hi,
        });
    }
    let mut chosen = b.read(lo, cx.now)?.span;
    for slot in lo + 1..hi {
        let span = b.read(slot, cx.now)?.span;
        if span.score > chosen.score {
            chosen = span;
        }
    }
    Ok(chosen)
}
