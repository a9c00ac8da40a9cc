//! The GPU side of the phase tests: the three VM kernels run on packed states, and the
//! comparisons that hold their results to the host interpreter's.
#![allow(dead_code)]

pub mod compare;
pub mod lockstep;
pub mod random;
pub mod resident;

use octoflow_agents::gpu_state::VmImage;
use octoflow_kernels::agents::layout::{H_EV_CAP, SAMPLER_WORDS};
use octoflow_kernels::agents::vm_plan::RowShape;
use octoflow_kernels::agents::{
    step_words, VmAdvance, VmBuffers, VmDims, VmInterpret, VmPlan, VmRows,
};
use octoflow_vk::testing::gpu_or_skip;
use octoflow_vk::{Buffer, Chain, Context, MemoryKind};

/// Written over every output table before a kernel runs: a word it fails to write shows.
pub const POISON: u32 = 0xdead_beef;

/// The device and the three kernels.
pub struct Gpu {
    pub ctx: Context,
    pub interpret: VmInterpret,
    pub plan: VmPlan,
    pub advance: VmAdvance,
}

/// What `vm_plan` wrote, table by table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowTables {
    pub table: Vec<u32>,
    pub ids: Vec<u32>,
    pub out_rows: Vec<u32>,
    pub mix: Vec<u32>,
    pub states: Vec<u32>,
    pub step: Vec<u32>,
    pub owners: Vec<u32>,
}

fn buffer(ctx: &Context, name: &str, words: &[u32]) -> Buffer {
    let bytes = 4 * words.len().max(1) as u64;
    let b = Buffer::new(ctx, name, bytes, MemoryKind::DeviceLocal).expect("buffer");
    if words.is_empty() {
        ctx.fill(&b, 0, bytes, 0).expect("fill");
    } else {
        ctx.upload(&b, 0, words).expect("upload");
    }
    b
}

fn poisoned(ctx: &Context, name: &str, words: usize) -> Buffer {
    buffer(ctx, name, &vec![POISON; words.max(1)])
}

fn read(ctx: &Context, b: &Buffer, words: usize) -> Vec<u32> {
    let mut out = vec![0u32; words];
    if words > 0 {
        ctx.download(b, 0, &mut out).expect("download");
    }
    out
}

/// A state's buffers on the device, in the order of [`VmBuffers`].
struct State {
    bufs: [Buffer; 8],
}

impl State {
    fn new(ctx: &Context, img: &VmImage) -> Self {
        // The ring is poisoned: a record the kernel claims and leaves unwritten shows.
        let events = vec![POISON; img.events.len()];
        let parts: [(&str, &[u32]); 8] = [
            ("vm_hdr", &img.hdr),
            ("vm_prog", &img.prog),
            ("vm_inst", &img.inst),
            ("vm_arena", &img.arena),
            ("vm_tables", &img.tables),
            ("vm_queues", &img.queues),
            ("vm_boxes", &img.boxes),
            ("vm_events", &events),
        ];
        State {
            bufs: parts.map(|(name, words)| buffer(ctx, name, words)),
        }
    }

    fn slices(&self) -> VmBuffers {
        let w = |i: usize| self.bufs[i].whole();
        VmBuffers {
            hdr: w(0),
            prog: w(1),
            inst: w(2),
            arena: w(3),
            tables: w(4),
            queues: w(5),
            boxes: w(6),
            events: w(7),
        }
    }

    /// The state after a run, with the sizes of `img`.
    fn image(&self, ctx: &Context, img: &VmImage) -> VmImage {
        let r = |i: usize, n: usize| read(ctx, &self.bufs[i], n);
        VmImage {
            hdr: r(0, img.hdr.len()),
            prog: r(1, img.prog.len()),
            inst: r(2, img.inst.len()),
            arena: r(3, img.arena.len()),
            tables: r(4, img.tables.len()),
            queues: r(5, img.queues.len()),
            boxes: r(6, img.boxes.len()),
            events: r(7, img.events.len()),
        }
    }
}

fn dims(img: &VmImage) -> VmDims {
    use octoflow_kernels::agents::layout::{H_N, H_N_BOXES, H_N_QUEUES};
    VmDims {
        instances: img.hdr[H_N as usize],
        queues: img.hdr[H_N_QUEUES as usize],
        boxes: img.hdr[H_N_BOXES as usize],
    }
}

impl Gpu {
    /// The device (`None` after a skip line when GPU tests are off).
    pub fn new(test: &str) -> Option<Self> {
        let ctx = gpu_or_skip(test)?;
        Some(Gpu {
            interpret: VmInterpret::new(&ctx).expect("vm_interpret"),
            plan: VmPlan::new(&ctx).expect("vm_plan"),
            advance: VmAdvance::new(&ctx).expect("vm_advance"),
            ctx,
        })
    }

    /// Runs the interpret phase on `img`; the state after it.
    pub fn interpret(&self, img: &VmImage) -> VmImage {
        assert!(img.hdr[H_EV_CAP as usize] > 0, "an event ring");
        let state = State::new(&self.ctx, img);
        let mut chain = Chain::new(&self.ctx).expect("chain");
        self.interpret
            .record(&mut chain, &state.slices(), dims(img))
            .expect("record vm_interpret");
        chain.run().expect("run vm_interpret");
        state.image(&self.ctx, img)
    }

    /// Runs the plan phase on `img`; every table it writes (poisoned before).
    pub fn plan(&self, img: &VmImage, shape: RowShape) -> RowTables {
        let state = State::new(&self.ctx, img);
        let n = dims(img).instances;
        let (r, o) = (shape.max_rows as usize, shape.max_out as usize);
        let sizes = [
            2 * r,
            r,
            o,
            r,
            o * SAMPLER_WORDS as usize,
            step_words(n) as usize,
            r,
        ];
        let names = [
            "table", "ids", "out_rows", "mix", "states", "step", "owners",
        ];
        let bufs: Vec<Buffer> = names
            .iter()
            .zip(sizes)
            .map(|(name, words)| poisoned(&self.ctx, name, words))
            .collect();
        let rows = VmRows {
            table: bufs[0].whole(),
            ids: bufs[1].whole(),
            out_rows: bufs[2].whole(),
            mix: bufs[3].whole(),
            states: bufs[4].whole(),
            step: bufs[5].whole(),
            owners: bufs[6].whole(),
        };
        let mut chain = Chain::new(&self.ctx).expect("chain");
        self.plan
            .record(&mut chain, &state.slices(), n, &rows, shape)
            .expect("record vm_plan");
        chain.run().expect("run vm_plan");
        let mut after = state.image(&self.ctx, img);
        after.events.clone_from(&img.events); // poisoned on the device
        assert_eq!(&after, img, "vm_plan changed the state");
        let t = |i: usize| read(&self.ctx, &bufs[i], sizes[i]);
        RowTables {
            table: t(0),
            ids: t(1),
            out_rows: t(2),
            mix: t(3),
            states: t(4),
            step: t(5),
            owners: t(6),
        }
    }

    /// Runs the advance phase on `img` with a step record and the sampled tokens and their
    /// log-probabilities (laid out as the sampler writes them: tokens, then the f32 bits).
    pub fn advance(
        &self,
        img: &VmImage,
        step: &[u32],
        tokens: &[u32],
        logprobs: &[f32],
    ) -> VmImage {
        let state = State::new(&self.ctx, img);
        let n = dims(img).instances;
        let step = buffer(&self.ctx, "step", step);
        assert_eq!(tokens.len(), logprobs.len());
        let max_out = tokens.len() as u32;
        let words: Vec<u32> = tokens
            .iter()
            .copied()
            .chain(logprobs.iter().map(|l| l.to_bits()))
            .collect();
        let tokens = buffer(&self.ctx, "tokens", &words);
        let mut chain = Chain::new(&self.ctx).expect("chain");
        self.advance
            .record(
                &mut chain,
                &state.slices(),
                n,
                &step.whole(),
                &tokens.whole(),
                max_out,
            )
            .expect("record vm_advance");
        chain.run().expect("run vm_advance");
        state.image(&self.ctx, img)
    }
}
