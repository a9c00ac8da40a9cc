//! The run's shared memory: the token arena, task queues and mailboxes.
//!
//! Writes become visible at the next step (docs/VM.md, "Visibility"). Each queue and mailbox
//! keeps, besides its contents, how many of them were written in the current step and that
//! step's number (its *stamp*); a reader at step `s` discounts what was written at step `s`.
//! That is all the bookkeeping the rule needs, because every write and every read happens in
//! the interpret phase of some step: nothing written at `s` can be read before `s + 1`.

use octoflow_core::Finish;

use crate::error::Fault;

/// A generated (or chosen) run of tokens in the arena, with how it ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    /// First token's index in the arena.
    pub offset: u32,
    /// Tokens kept: the generated ones without the stop match that ended the span (`%len`).
    pub len: u32,
    /// Tokens generated, the stop match included.
    pub generated: u32,
    /// Why generation ended (`None` while it runs).
    pub finish: Option<Finish>,
    /// `%stop`: 0 none, 1 an end-of-generation token, `2 + k` the stop set's sequence `k`.
    pub stop: u32,
    /// Mean log-probability of the generated tokens at temperature 1 (`-inf` for no tokens;
    /// the engine's log-probabilities where it sampled on the device).
    pub score: f32,
}

impl Span {
    /// `%finish`: 0 none, 1 stop (an end-of-generation token or a stop-set sequence), 2 length
    /// (the token limit or a full context).
    pub fn finish_code(&self) -> u32 {
        match self.finish {
            None => 0,
            Some(Finish::Eog | Finish::Stop) => 1,
            Some(Finish::Length | Finish::Context) => 2,
        }
    }
}

/// Tokens the host placed or a program pushed: what `append.task` feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    pub offset: u32,
    pub len: u32,
    /// The host task it descends from (`%parent`).
    pub parent: u32,
}

/// One array of token ids with a bump allocator.
#[derive(Debug, Clone)]
pub struct Arena {
    pub(crate) tokens: Vec<u32>,
    pub(crate) cap: usize,
}

impl Arena {
    /// An empty arena that may grow to `cap` tokens (it grows as it is used).
    pub fn new(cap: usize) -> Self {
        Self {
            tokens: Vec::new(),
            cap,
        }
    }

    /// Tokens taken so far.
    pub fn used(&self) -> usize {
        self.tokens.len()
    }

    /// Takes `n` tokens; returns the first one's index.
    pub fn alloc(&mut self, n: u32) -> Result<u32, Fault> {
        let used = self.tokens.len();
        if used + n as usize > self.cap {
            return Err(Fault::ArenaFull {
                need: n as u64,
                used: used as u64,
                cap: self.cap as u64,
            });
        }
        self.tokens.resize(used + n as usize, 0);
        Ok(used as u32)
    }

    /// Copies `tokens` into a fresh allocation; returns its offset.
    pub fn put(&mut self, tokens: &[u32]) -> Result<u32, Fault> {
        let offset = self.alloc(tokens.len() as u32)?;
        self.tokens[offset as usize..].copy_from_slice(tokens);
        Ok(offset)
    }

    /// The tokens at `offset..offset + len` (allocated: spans only name allocations).
    pub fn get(&self, offset: u32, len: u32) -> &[u32] {
        &self.tokens[offset as usize..(offset + len) as usize]
    }

    /// Writes one token of an allocation.
    pub fn write(&mut self, index: u32, token: u32) {
        self.tokens[index as usize] = token;
    }
}

/// Counts writes of the current step so readers can discount them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fresh {
    pub(crate) step: u64,
    pub(crate) count: u32,
}

impl Fresh {
    fn add(&mut self, now: u64) {
        if self.step != now {
            *self = Fresh {
                step: now,
                count: 0,
            };
        }
        self.count += 1;
    }

    fn at(&self, now: u64) -> u32 {
        if self.step == now {
            self.count
        } else {
            0
        }
    }
}

/// What `take` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The task at this index of the queue.
    Task(u32, Task),
    /// Empty and closed: no task will come.
    Closed,
    /// Empty and open: wait.
    Empty,
}

/// A task queue: pushes append, takes hand out in order.
#[derive(Debug, Clone)]
pub struct Queue {
    pub name: String,
    pub cap: u32,
    pub(crate) items: Vec<Task>,
    pub(crate) taken: u32,
    pub(crate) fresh: Fresh,
    /// The step of the first close and the instance that closed (`None` for the host's queue,
    /// closed before the first step).
    pub(crate) closed: Option<(u64, Option<u32>)>,
}

impl Queue {
    /// An open, empty queue.
    pub fn new(name: &str, cap: u32) -> Self {
        Self {
            name: name.into(),
            cap,
            items: Vec::new(),
            taken: 0,
            fresh: Fresh::default(),
            closed: None,
        }
    }

    /// The host's queue: `tasks`, visible and closed from the first step.
    pub fn host(tasks: Vec<Task>) -> Self {
        Self {
            name: "tasks".into(),
            cap: tasks.len() as u32,
            items: tasks,
            taken: 0,
            fresh: Fresh {
                step: u64::MAX,
                count: 0,
            },
            closed: Some((0, None)),
        }
    }

    /// Tasks pushed so far (visible or not).
    pub fn len(&self) -> u32 {
        self.items.len() as u32
    }

    /// Whether nothing was ever pushed.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Tasks handed out.
    pub fn taken(&self) -> u32 {
        self.taken
    }

    /// Task `index` (the host's queue: every instance may read every task).
    pub fn get(&self, index: u32) -> Option<Task> {
        self.items.get(index as usize).copied()
    }

    /// Appends `task` at step `now` for `instance`; returns its index.
    ///
    /// A close is final once visible; within the step of the close, only its own instance has
    /// seen it (others' pushes of that step land, in any order, before it).
    pub fn push(&mut self, task: Task, now: u64, instance: u32) -> Result<u32, Fault> {
        if let Some((step, by)) = self.closed {
            if step < now || by.is_none() || by == Some(instance) {
                return Err(Fault::QueueClosed {
                    queue: self.name.clone(),
                });
            }
        }
        if self.len() >= self.cap {
            return Err(Fault::QueueFull {
                queue: self.name.clone(),
                cap: self.cap,
            });
        }
        self.items.push(task);
        self.fresh.add(now);
        Ok(self.len() - 1)
    }

    /// Tasks pushed before step `now` (what `take` sees at `now`).
    pub fn visible(&self, now: u64) -> u32 {
        self.len() - self.fresh.at(now)
    }

    /// The next task visible at step `now`, if any.
    pub fn take(&mut self, now: u64) -> Take {
        let visible = self.visible(now);
        if self.taken < visible {
            let i = self.taken;
            self.taken += 1;
            return Take::Task(i, self.items[i as usize]);
        }
        match self.closed {
            Some((step, _)) if step < now || self.closed_from_start() => Take::Closed,
            _ => Take::Empty,
        }
    }

    fn closed_from_start(&self) -> bool {
        matches!(self.closed, Some((_, None)))
    }

    /// No more pushes (a second close changes nothing).
    pub fn close(&mut self, now: u64, instance: u32) {
        if self.closed.is_none() {
            self.closed = Some((now, Some(instance)));
        }
    }
}

/// A message: the sender's last span, who sent it and for which host task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Message {
    pub span: Span,
    pub sender: u32,
    pub parent: u32,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Slot {
    pub(crate) message: Message,
    /// Raised once per write (a slot is written at most once, so 0 or 1).
    pub(crate) seq: u32,
    /// The step of the write.
    pub(crate) stamp: u64,
}

/// An array of message slots, addressed by index.
#[derive(Debug, Clone)]
pub struct Mailbox {
    pub name: String,
    pub cap: u32,
    /// Grown to the highest slot written, so a large capacity costs nothing until used.
    pub(crate) slots: Vec<Option<Slot>>,
    pub(crate) count: u32,
    pub(crate) fresh: Fresh,
}

impl Mailbox {
    /// An empty mailbox of `cap` slots.
    pub fn new(name: &str, cap: u32) -> Self {
        Self {
            name: name.into(),
            cap,
            slots: Vec::new(),
            count: 0,
            fresh: Fresh::default(),
        }
    }

    fn past(&self, slot: u32) -> Fault {
        Fault::SlotPastCapacity {
            mailbox: self.name.clone(),
            slot,
            cap: self.cap,
        }
    }

    /// Writes `slot` at step `now`.
    pub fn send(&mut self, slot: u32, message: Message, now: u64) -> Result<(), Fault> {
        if slot >= self.cap {
            return Err(self.past(slot));
        }
        let i = slot as usize;
        if i >= self.slots.len() {
            self.slots.resize(i + 1, None);
        }
        if self.slots[i].is_some() {
            return Err(Fault::SlotFull {
                mailbox: self.name.clone(),
                slot,
            });
        }
        self.slots[i] = Some(Slot {
            message,
            seq: 1,
            stamp: now,
        });
        self.count += 1;
        self.fresh.add(now);
        Ok(())
    }

    /// The message in `slot` as visible at step `now`.
    pub fn read(&self, slot: u32, now: u64) -> Result<Message, Fault> {
        if slot >= self.cap {
            return Err(self.past(slot));
        }
        match self.slots.get(slot as usize).copied().flatten() {
            Some(s) if s.stamp < now && s.seq > 0 => Ok(s.message),
            _ => Err(Fault::SlotEmpty {
                mailbox: self.name.clone(),
                slot,
            }),
        }
    }

    /// Messages visible at step `now`.
    pub fn count(&self, now: u64) -> u32 {
        self.count - self.fresh.at(now)
    }

    /// Messages written so far (visible or not).
    pub fn written(&self) -> u32 {
        self.count
    }
}

/// Everything instances share.
#[derive(Debug, Clone)]
pub struct Memory {
    pub arena: Arena,
    /// `tasks` (the host's) first, then the program's queues.
    pub queues: Vec<Queue>,
    pub mailboxes: Vec<Mailbox>,
    /// Each constant's `(offset, len)` in the arena.
    pub consts: Vec<(u32, u32)>,
    /// Each stop set's token sequences.
    pub stops: Vec<Vec<Vec<u32>>>,
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
