//! Random valid agent programs that use every instruction, with the guards that keep a step's
//! outcome independent of the order instances run in (so the GPU's result is comparable word
//! for word with the host's): each program queue has one taking and one pushing/closing
//! instance, and every `send` writes a slot of the form `k * %n + %id`, which no other
//! instance can name. Everything else — faults included — is left to chance.

use rand::rngs::StdRng;
use rand::Rng;

/// A program with the run it is meant for.
#[derive(Debug, Clone)]
pub struct Case {
    pub src: String,
    pub instances: usize,
    pub tasks: Vec<Vec<u32>>,
    pub n_ctx: usize,
    pub max_rows: usize,
    pub chunk: usize,
    /// Arena tokens (`None`: the default, large).
    pub arena: Option<usize>,
    pub max_tokens: u32,
}

/// Registers the generator keeps for itself: a slot and a loop counter.
const SLOT_REG: &str = "r14";
const LOOP_REG: &str = "r15";

const SPECIALS: [&str; 11] = [
    "%id", "%n", "%task", "%parent", "%tasks", "%max", "%rounds", "%len", "%finish", "%pos",
    "%stop",
];

struct Gen<'a> {
    rng: &'a mut StdRng,
    lines: Vec<String>,
    /// Forward labels not yet placed.
    open: Vec<String>,
    labels: usize,
    n: usize,
}

impl Gen<'_> {
    fn label(&mut self) -> String {
        self.labels += 1;
        format!("L{}", self.labels)
    }

    /// A forward target, placed later.
    fn target(&mut self) -> String {
        if !self.open.is_empty() && self.rng.gen_bool(0.4) {
            let i = self.rng.gen_range(0..self.open.len());
            return self.open[i].clone();
        }
        let l = self.label();
        self.open.push(l.clone());
        l
    }

    fn place_some(&mut self) {
        while !self.open.is_empty() && self.rng.gen_bool(0.3) {
            let i = self.rng.gen_range(0..self.open.len());
            let l = self.open.swap_remove(i);
            self.lines.push(format!("{l}:"));
        }
    }

    fn reg(&mut self) -> String {
        format!("r{}", self.rng.gen_range(0..14))
    }

    fn value(&mut self) -> String {
        match self.rng.gen_range(0..10) {
            0..=3 => self.rng.gen_range(0..8u32).to_string(),
            4 => ["4294967295", "1000", "0x10"][self.rng.gen_range(0..3)].to_string(),
            5..=6 => self.reg(),
            _ => SPECIALS[self.rng.gen_range(0..SPECIALS.len())].to_string(),
        }
    }

    fn small(&mut self) -> String {
        match self.rng.gen_range(0..4) {
            0 => self.reg(),
            1 => "%max".into(),
            _ => self.rng.gen_range(0..6u32).to_string(),
        }
    }

    fn mailbox(&mut self) -> &'static str {
        ["M0", "M1"][self.rng.gen_range(0..2)]
    }

    fn stop(&mut self) -> &'static str {
        ["S0", "S1", "-", "-"][self.rng.gen_range(0..4)]
    }

    /// `bne %id, owner, skip; <line>; skip:` — only `owner` runs `line`.
    fn only(&mut self, owner: usize, line: String) {
        let skip = self.label();
        self.lines.push(format!("    bne %id, {owner}, {skip}"));
        self.lines.push(format!("    {line}"));
        self.lines.push(format!("{skip}:"));
    }

    fn push(&mut self, line: String) {
        self.lines.push(format!("    {line}"));
    }

    fn segment(&mut self) {
        let n = self.n;
        let queues = [("W", 1), ("V", 2)];
        match self.rng.gen_range(0..24) {
            0..=2 => {
                let op = ["add", "sub", "mul", "div", "rem", "set"][self.rng.gen_range(0..6)];
                let d = self.reg();
                let (x, y) = (self.value(), self.value());
                let line = if op == "set" {
                    format!("set {d}, {x}")
                } else {
                    format!("{op} {d}, {x}, {y}")
                };
                self.push(line);
            }
            3..=4 => {
                let op = ["beq", "bne", "blt", "bge"][self.rng.gen_range(0..4)];
                let (x, y, t) = (self.value(), self.value(), self.target());
                self.push(format!("{op} {x}, {y}, {t}"));
            }
            5..=7 => {
                let line = match self.rng.gen_range(0..5) {
                    0 => "append.task".to_string(),
                    1 | 2 => format!("append.const C{}", self.rng.gen_range(0..2)),
                    3 => "append.last".to_string(),
                    _ => {
                        let (m, v) = (self.mailbox(), self.value());
                        format!("append.msg {m}, {v}")
                    }
                };
                self.push(line);
                if self.rng.gen_bool(0.7) {
                    let (x, s) = (self.small(), self.stop());
                    self.push(format!("gen {x}, {s}"));
                }
            }
            8..=9 => {
                let (x, s) = (self.small(), self.stop());
                self.push(format!("gen {x}, {s}"));
            }
            10..=11 => {
                let (k, m) = (self.rng.gen_range(0..4), self.mailbox());
                self.push(format!("mul {SLOT_REG}, {k}, %n"));
                self.push(format!("add {SLOT_REG}, {SLOT_REG}, %id"));
                self.push(format!("send {m}, {SLOT_REG}"));
            }
            12 => {
                let m = self.mailbox();
                let x = if self.rng.gen_bool(0.8) {
                    self.rng.gen_range(0..2u32).to_string()
                } else {
                    self.value()
                };
                self.push(format!("wait {m}, {x}"));
            }
            13 => {
                // registers for the bounds: the assembler refuses an immediate empty range
                let (m, x, k) = (self.mailbox(), self.value(), self.rng.gen_range(0..4));
                self.push(format!("set r13, {x}"));
                self.push(format!("add r11, r13, {k}"));
                self.push(format!("best {m}, r13, r11"));
            }
            14..=15 => {
                let (q, k) = [("tasks", 0), queues[0], queues[1]][self.rng.gen_range(0..3)];
                let t = self.target();
                self.only(k % n, format!("take {q}, {t}"));
            }
            16 => {
                let v = self.value();
                self.push(format!("task {v}"));
            }
            17..=18 => {
                let (q, k) = queues[self.rng.gen_range(0..2)];
                let d = self.reg();
                if self.rng.gen_bool(0.15) {
                    // the host's queue is closed from the start: a fault for everyone
                    self.push(format!("push tasks, {d}"));
                } else {
                    self.only((k + 1) % n, format!("push {q}, {d}"));
                }
            }
            19 => {
                let (q, k) = queues[self.rng.gen_range(0..2)];
                self.only((k + 1) % n, format!("close {q}"));
            }
            20 => {
                let v = self.value();
                self.push(format!("emit {v}"));
            }
            21 => self.push("reset".into()),
            22 => {
                let v = self.value();
                self.push(format!("seed {v}"));
            }
            _ => {
                let (x, y) = (self.value(), self.value());
                let skip = self.label();
                self.push(format!("bne {x}, {y}, {skip}"));
                self.push("halt".into());
                self.lines.push(format!("{skip}:"));
            }
        }
        self.place_some();
    }
}

/// A random program and run: 1..=6 instances, 1..=3 host tasks, short contexts and row
/// budgets (so context, chunk and row limits all bite).
pub fn case(rng: &mut StdRng) -> Case {
    let n = rng.gen_range(1..=6);
    let mut g = Gen {
        rng,
        lines: Vec::new(),
        open: Vec::new(),
        labels: 0,
        n,
    };
    let mut head = vec![
        ".stop S0 \"ab\", \"b\", 100".to_string(),
        ".stop S1 \"cd\", \"dcd\"".to_string(),
        ".const C0 \"abc\"".to_string(),
        ".const C1 \"d\"".to_string(),
        ".queue W 6".to_string(),
        ".queue V %n".to_string(),
        ".mailbox M0 %n*4".to_string(),
        ".mailbox M1 3*%n".to_string(),
    ];
    let rounds = g.rng.gen_range(1..=3);
    // A current task and a last span to start from, so that few programs fault at once.
    g.push(format!("set {LOOP_REG}, 0"));
    if g.rng.gen_bool(0.8) {
        g.push("rem r12, %id, %tasks".into());
        g.push("task r12".into());
        g.push("append.task".into());
        g.push("gen 3, S0".into());
    }
    g.lines.push("top:".into());
    for _ in 0..g.rng.gen_range(4..=14) {
        g.segment();
    }
    g.push(format!("add {LOOP_REG}, {LOOP_REG}, 1"));
    g.push(format!("blt {LOOP_REG}, {rounds}, top"));
    if g.rng.gen_bool(0.1) {
        // A loop that never yields: `no progress` once the budget runs out.
        g.lines.push("spin:".into());
        g.push("add r13, r13, 1".into());
        g.push("blt r13, 100000, spin".into());
    }
    let open = std::mem::take(&mut g.open);
    for l in open {
        g.lines.push(format!("{l}:"));
    }
    // The pushers close their queues, so that a waiting `take` ends.
    g.only(2 % n, "close W".into());
    g.only(3 % n, "close V".into());
    g.push("halt".into());
    let tasks: Vec<Vec<u32>> = (0..g.rng.gen_range(1..=3))
        .map(|_| {
            (0..g.rng.gen_range(1..=4))
                .map(|_| g.rng.gen_range(97..101))
                .collect()
        })
        .collect();
    let n_ctx = [6, 12, 40][g.rng.gen_range(0..3)];
    let max_rows = [1, 3, 7, 64][g.rng.gen_range(0..4)];
    let chunk = [1, 2, 5, 256][g.rng.gen_range(0..4)];
    let arena = (n == 1 && g.rng.gen_bool(0.5))
        .then(|| 6 + tasks.iter().map(Vec::len).sum::<usize>() + g.rng.gen_range(0..20));
    let max_tokens = g.rng.gen_range(1..=5);
    head.extend(g.lines);
    Case {
        src: head.join("\n") + "\n",
        instances: n,
        tasks,
        n_ctx,
        max_rows,
        chunk,
        arena,
        max_tokens,
    }
}

/// The fake engine's next token for the random programs: one of `a b c d` from a hash of the
/// context, the end-of-generation token one time in nine, so stop sets and `eog` both bite.
pub fn next(ctx: &[u32]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in ctx {
        h = (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 29;
    match h % 9 {
        0 => 256,
        k => 97 + (k % 4) as u32,
    }
}
