//! Phases 2 and 3 of a step: which rows each instance gets, and what it does with their
//! results (docs/VM.md, "A step").
//!
//! Rows go first to instances that generate (one each, in instance order), then to instances
//! that feed (in instance order, each `min(remaining, chunk, max_rows - rows so far)`). Instance
//! `i` uses KV slot `i`; its rows sit at consecutive positions from its `pos`, so the first one
//! also tells the engine to forget the slot from there on (that is how `reset` takes effect).

use octoflow_model::{BatchRow, RowOutput, RowResult, TokenIn};

use crate::error::AgentError;
use crate::interp::Env;
use crate::memory::Memory;
use crate::sample::{logprob, Sampling};
use crate::state::{Instance, Presample, Status};

/// How the host asks for the draws.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draws {
    pub sampling: Sampling,
    /// Ask the engine for [`RowOutput::Sample`] instead of logits: the token and its
    /// log-probability come back, computed by the engine.
    pub on_device: bool,
}

/// Which instance a planned row belongs to, and whether it is the one that samples.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub instance: u32,
    pub samples: bool,
}

/// The rows of one step and whom each belongs to.
pub struct Plan {
    pub rows: Vec<BatchRow>,
    pub owners: Vec<Owner>,
    /// The first `gen_rows` rows are generating instances' (one each).
    pub gen_rows: usize,
}

/// The rows of one step, instance by instance.
pub fn plan(
    instances: &[Instance],
    mem: &Memory,
    draws: &Draws,
    chunk: usize,
    max_rows: usize,
) -> Plan {
    let mut rows = Vec::new();
    let mut owners = Vec::new();
    let output = |inst: &Instance| {
        let draw = draws.sampling.draw(inst.seed, inst.draws);
        if draws.on_device {
            RowOutput::Sample(draw)
        } else {
            RowOutput::Logits
        }
    };
    for inst in instances.iter().filter(|i| i.status == Status::Gen) {
        if rows.len() >= max_rows {
            break;
        }
        let Some(token) = inst.pending else { continue };
        rows.push(row(inst, inst.pos, token, output(inst)));
        owners.push(Owner {
            instance: inst.id,
            samples: true,
        });
    }
    let gen_rows = rows.len();
    for inst in instances.iter().filter(|i| i.status == Status::Feed) {
        let room = max_rows.saturating_sub(rows.len());
        if room == 0 {
            break;
        }
        let f = &inst.feed;
        let take = (f.total() - f.cursor).min(chunk as u32).min(room as u32);
        for k in 0..take {
            let last = f.cursor + k + 1 == f.total();
            let out = if last { output(inst) } else { RowOutput::None };
            let token = f.token(&mem.arena, f.cursor + k);
            rows.push(row(inst, inst.pos + k, token, out));
            owners.push(Owner {
                instance: inst.id,
                samples: last,
            });
        }
    }
    Plan {
        rows,
        owners,
        gen_rows,
    }
}

fn row(inst: &Instance, pos: u32, token: u32, output: RowOutput) -> BatchRow {
    BatchRow {
        slot: inst.id,
        pos,
        token: TokenIn::Id(token),
        output,
        adapter: None,
    }
}

/// The token a sampling row gives, and its log-probability (the engine's when it sampled).
fn draw_of(
    inst: &Instance,
    result: &RowResult,
    row: usize,
    draws: &Draws,
) -> Result<(u32, f32), AgentError> {
    match result {
        RowResult::Logits(logits) => {
            let t = draws
                .sampling
                .draw(inst.seed, inst.draws)
                .sample_cpu(logits);
            Ok((t, logprob(logits, t)))
        }
        RowResult::Token { token, logprob } if draws.on_device => Ok((*token, *logprob)),
        other => Err(AgentError::EngineResult {
            row,
            asked: if draws.on_device {
                "a sampled token"
            } else {
                "logits"
            },
            found: format!("{other:?}").chars().take(40).collect(),
        }),
    }
}

/// Phase 3: every instance that had rows takes their results.
pub fn advance(
    instances: &mut [Instance],
    mem: &mut Memory,
    env: &Env,
    draws: &Draws,
    owners: &[Owner],
    results: &[RowResult],
) -> Result<(), AgentError> {
    for (row, (owner, result)) in owners.iter().zip(results).enumerate() {
        let inst = &mut instances[owner.instance as usize];
        match inst.status {
            Status::Gen => {
                // The row fed the pending token at `pos`.
                inst.pos += 1;
                inst.pending = None;
                let (t, lp) = draw_of(inst, result, row, draws)?;
                if inst.accept(&mut mem.arena, t, lp, &env.eog, &mem.stops, env.n_ctx) {
                    inst.status = Status::Run;
                }
            }
            Status::Feed => {
                inst.pos += 1;
                inst.feed.cursor += 1;
                if owner.samples {
                    let (token, logprob) = draw_of(inst, result, row, draws)?;
                    inst.presample = Some(Presample { token, logprob });
                    inst.status = Status::Run;
                }
            }
            _ => {}
        }
    }
    Ok(())
}
