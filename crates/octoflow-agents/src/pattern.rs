//! The shipped programs, one per collaboration pattern (`programs/*.s`).

use std::fmt;
use std::str::FromStr;

/// A shipped program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// Every instance drains the host's tasks; one answer per task.
    Queue,
    /// Every instance answers every task; instance 0 emits the best-scored answer.
    BestOf,
    /// Instances answer, read each other's answers and revise, `%rounds` rounds per task.
    Debate,
    /// Instance 0 splits each task into sub-questions, the others answer them, instance 0
    /// writes the final answer.
    Swarm,
}

impl Pattern {
    /// Every pattern.
    pub const ALL: [Pattern; 4] = [
        Pattern::Queue,
        Pattern::BestOf,
        Pattern::Debate,
        Pattern::Swarm,
    ];

    /// The name the CLI takes (`queue`, `best-of`, `debate`, `swarm`).
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Queue => "queue",
            Pattern::BestOf => "best-of",
            Pattern::Debate => "debate",
            Pattern::Swarm => "swarm",
        }
    }

    /// The program's text.
    pub fn source(self) -> &'static str {
        match self {
            Pattern::Queue => include_str!("programs/queue.s"),
            Pattern::BestOf => include_str!("programs/best-of.s"),
            Pattern::Debate => include_str!("programs/debate.s"),
            Pattern::Swarm => include_str!("programs/swarm.s"),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pattern `{0}` (expected queue, best-of, debate or swarm)")]
pub struct UnknownPattern(pub String);

impl FromStr for Pattern {
    type Err = UnknownPattern;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pattern::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownPattern(s.into()))
    }
}
