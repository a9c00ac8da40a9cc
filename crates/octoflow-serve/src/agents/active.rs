//! An agent run the scheduler has admitted: the host interpreter ([`Run`]) over the instances
//! it was given, stepped in the server's shared steps (docs/VM.md, "Over HTTP").
//!
//! Per scheduler step a run whose previous rows are back runs its interpret phase and plans at
//! most the rows the step has left for it; its rows join the ordinary sequences' rows in one
//! `submit`, with each planned row's slot (the instance's index) mapped to the engine slot the
//! instance was given. When that step is collected the run takes its slice of the results
//! (advance, end of step). Its rows never appear in the ordinary sequences' step metadata, so
//! a device-sampled agent row is never taken as a sequence's [`octoflow_model::TokenIn::Sampled`].

use std::time::Instant;

use octoflow_agents::plan::Owner;
use octoflow_agents::{AgentError, Run, StartError};
use octoflow_model::{BatchForward, BatchRow, RowResult};
use octoflow_text::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use super::job::{AgentJob, AgentMsg, Summary};
use super::lines::Lines;

/// An admitted run.
pub struct ActiveRun {
    /// Unique among the runs ever admitted (results of a cancelled run's rows are dropped).
    pub id: u64,
    run: Run,
    /// Instance `i` runs in engine slot `slots[i]`.
    pub slots: Vec<usize>,
    lines: Lines,
    events: UnboundedSender<AgentMsg>,
    started: Instant,
    /// Some of its rows are in a step not yet collected.
    pub in_flight: bool,
}

/// The rows a run put into a step: where they start and whom each belongs to.
pub struct Planned {
    pub run: u64,
    /// Index of the run's first row in the step.
    pub first: usize,
    pub owners: Vec<Owner>,
    pub gen_rows: usize,
    /// Whether the step's interpret phase changed anything (deadlock detection).
    pub changed: bool,
}

/// What a run's part of a step came to.
pub enum Part {
    /// Rows were added to the step.
    Rows(Planned),
    /// No rows: the step ended at once (the run goes on or ended).
    Interpreted(Outcome),
}

/// Whether a run goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Continue,
    /// Every instance halted or failed; the summary was sent. Its instances are free.
    Done,
    /// The run failed as a whole; the failure was sent. Its instances are free.
    Failed,
}

/// Maps planned rows' slots (instance indices) to the engine slots the instances were given;
/// `None` when a row names an instance past `slots` (the plan and the run disagree).
pub fn map_slots(rows: &mut [BatchRow], slots: &[usize]) -> Option<()> {
    for row in rows {
        row.slot = *slots.get(row.slot as usize)? as u32;
    }
    Some(())
}

impl ActiveRun {
    /// Starts `job` in `slots` (as many as its instances) of `engine`; a run that cannot start
    /// is refused through its channel.
    pub fn start(
        id: u64,
        job: AgentJob,
        slots: Vec<usize>,
        engine: &dyn BatchForward,
        chunk: usize,
    ) -> Result<Self, StartError> {
        let mut config = job.config;
        config.chunk = chunk.max(1);
        match Run::new(job.program, config, job.tasks, engine) {
            Ok(run) => {
                let _ = job.events.send(AgentMsg::Started);
                Ok(Self {
                    id,
                    run,
                    slots,
                    lines: Lines::new(job.ids),
                    events: job.events,
                    started: Instant::now(),
                    in_flight: false,
                })
            }
            Err(e) => {
                let _ = job.events.send(AgentMsg::Refused(e.to_string()));
                Err(e)
            }
        }
    }

    /// Whether the client went away.
    pub fn disconnected(&self) -> bool {
        self.events.is_closed()
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> u64 {
        self.run.generated()
    }

    /// This run's part of a step with at most `room` rows left (`room > 0`: a step without
    /// room is skipped, so that a full step never looks like a deadlock): interpret, plan, and
    /// append the rows (in engine slots) to `rows`.
    pub fn plan(&mut self, room: usize, rows: &mut Vec<BatchRow>, tokenizer: &Tokenizer) -> Part {
        debug_assert!(room > 0 && !self.in_flight);
        let changed = self.run.interpret_phase();
        let mut plan = self.run.plan_phase(room);
        if plan.rows.is_empty() {
            let r = self.run.end_step(0, 0, changed);
            return Part::Interpreted(self.after_step(r, tokenizer));
        }
        if map_slots(&mut plan.rows, &self.slots).is_none() {
            self.fail(
                "a planned row names an instance the run does not have",
                "internal",
            );
            return Part::Interpreted(Outcome::Failed);
        }
        let first = rows.len();
        rows.extend(plan.rows);
        self.in_flight = true;
        Part::Rows(Planned {
            run: self.id,
            first,
            owners: plan.owners,
            gen_rows: plan.gen_rows,
            changed,
        })
    }

    /// Takes the results of the rows `planned` describes from a collected step's `results`.
    pub fn take(
        &mut self,
        planned: &Planned,
        results: &[RowResult],
        tokenizer: &Tokenizer,
    ) -> Outcome {
        self.in_flight = false;
        let n = planned.owners.len();
        let Some(mine) = results.get(planned.first..planned.first + n) else {
            self.fail("the engine returned fewer results than rows", "internal");
            return Outcome::Failed;
        };
        let r = self
            .run
            .advance_phase(&planned.owners, mine)
            .and_then(|()| self.run.end_step(n, planned.gen_rows, planned.changed));
        self.after_step(r, tokenizer)
    }

    /// Sends the step's lines, then the end if the run ended.
    fn after_step(
        &mut self,
        step: Result<octoflow_agents::StepReport, AgentError>,
        tokenizer: &Tokenizer,
    ) -> Outcome {
        for event in self.run.events() {
            let line = self.lines.line(event, tokenizer);
            let _ = self.events.send(AgentMsg::Line(line));
        }
        match step {
            Err(e) => {
                let code = match e {
                    AgentError::Deadlock(_) => "deadlock",
                    _ => "agent_run_failed",
                };
                self.fail(&e.to_string(), code);
                Outcome::Failed
            }
            Ok(_) if self.run.finished() => {
                let _ = self.events.send(AgentMsg::Done(Summary {
                    outputs: self.lines.outputs,
                    errors: self.lines.errors,
                    generated: self.run.generated(),
                    steps: self.run.steps(),
                    seconds: self.started.elapsed().as_secs_f64(),
                }));
                Outcome::Done
            }
            Ok(_) => Outcome::Continue,
        }
    }

    /// Ends the run with a failure message (nothing follows it).
    pub fn fail(&self, message: &str, code: &'static str) {
        let _ = self.events.send(AgentMsg::Failed {
            message: message.to_string(),
            code,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use octoflow_model::{RowOutput, TokenIn};

    fn row(slot: u32) -> BatchRow {
        BatchRow {
            slot,
            pos: 0,
            token: TokenIn::Id(1),
            output: RowOutput::None,
            adapter: None,
        }
    }

    #[test]
    fn instance_i_runs_in_the_ith_slot_the_run_was_given() {
        let mut rows = vec![row(0), row(2), row(1), row(0)];
        map_slots(&mut rows, &[5, 1, 7]).expect("every instance has a slot");
        let slots: Vec<u32> = rows.iter().map(|r| r.slot).collect();
        assert_eq!(slots, [5, 7, 1, 5]);
    }

    #[test]
    fn a_row_past_the_runs_instances_is_refused() {
        let mut rows = vec![row(3)];
        assert!(map_slots(&mut rows, &[0, 1]).is_none());
    }
}
