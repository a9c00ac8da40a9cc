//! A run on the GPU: the VM's state lives on the device and one chain holds `K` whole steps —
//! interpret, plan, the batched forward over the rows the plan wrote, advance, end of step —
//! so the host submits once per `K` steps and in between only reads the state back (the
//! events, whether the run is over) and resets the event ring.
//!
//! The host [`Run`] is kept as the mirror the state is unpacked into after each submit: its
//! events, its instances' statuses and its deadlock report are the GPU's. The sampler writes
//! each token's log-probability beside it, so spans carry scores and `best` runs here too.

use octoflow_kernels::agents::layout::{
    H_EV_HEAD, H_EV_LOST, H_EV_READ, H_LIVE, H_N, H_N_BOXES, H_N_QUEUES, H_STALLED, H_WORDS,
    SAMPLER_WORDS,
};
use octoflow_kernels::agents::vm_plan::RowShape;
use octoflow_kernels::agents::vm_select::row_buckets;
use octoflow_kernels::agents::{
    step_words, VmAdvance, VmBuffers, VmDims, VmEndStep, VmInterpret, VmPlan, VmRows, VmSelect,
};
use octoflow_kernels::gate::Gate;
use octoflow_model::gpu::{DeviceRows, GpuBatch, GpuModel};
use octoflow_model::BatchForward;
use octoflow_vk::{gate_words, summarize, Buffer, Chain, Context, LabelTime, MemoryKind};

use crate::error::AgentError;
use crate::event::Event;
use crate::gpu_state::{pack, unpack, VmImage};
use crate::program::Program;
use crate::run::{Run, RunConfig};

/// Event records the ring holds per instance and step of a chain: an instance emits at most a
/// few times a step in the shipped programs; a ring that overflows fails the run (never loses
/// an output silently).
const EVENTS_PER_INSTANCE_STEP: u32 = 2;

/// What one submit did.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmitReport {
    /// Steps the chain ran.
    pub steps: u32,
    /// Instances neither halted nor failed afterwards.
    pub live: u32,
    /// The outputs and errors of those steps, in ring order.
    pub events: Vec<Event>,
    /// The chain's GPU time in nanoseconds, from timestamps (`None` where the device has
    /// none): summed over submits against the wall time, how busy the host kept the GPU.
    pub gpu_ns: Option<f64>,
}

/// The VM's kernels, built once per device.
struct Kernels {
    interpret: VmInterpret,
    plan: VmPlan,
    advance: VmAdvance,
    end: VmEndStep,
    select: VmSelect,
    gate: Gate,
}

/// The batched forward recorded for one bucket of rows, as a gated span: `vm_select` writes
/// whether it runs, the gate kernel copies `template` (its dispatches' workgroup counts) or
/// zeros into `args`.
struct Bucket {
    rows: u32,
    template: Buffer,
    args: Buffer,
    words: u32,
}

/// A run resident on the GPU, `steps` steps per submit.
pub struct GpuRun<'m> {
    run: Run,
    ctx: Context,
    batch: GpuBatch<'m>,
    /// The state's buffers, in [`VmBuffers`]' order.
    state: Vec<Buffer>,
    /// Words of each state buffer.
    sizes: Vec<usize>,
    /// The row tables (`vm_plan` writes them, the forward and `vm_advance` read them).
    rows: Vec<Buffer>,
    tokens: Buffer,
    /// `[buckets]` u32: `vm_select`'s skip flags.
    skip: Buffer,
    buckets: Vec<Bucket>,
    kernels: Kernels,
    dims: VmDims,
    shape: RowShape,
    chain: Chain,
    steps: u32,
    done: bool,
    /// Per-kernel GPU time summed over the submits since profiling was turned on (`None`:
    /// off). Labels are scoped: `vm/…` for the VM's phases, `rows{N}/…` for the forward of
    /// the bucket of `N` rows, skipped or not.
    profile: Option<Vec<LabelTime>>,
}

impl<'m> GpuRun<'m> {
    /// Starts `program` on `tasks` with `config` on the GPU: a batch of `model` with `n_ctx`
    /// positions per instance and `max_rows` rows a step, the state uploaded, and the chain of
    /// `steps` steps recorded (which builds its pipelines).
    pub fn new(
        model: &'m GpuModel,
        program: Program,
        config: RunConfig,
        tasks: Vec<Vec<u32>>,
        n_ctx: usize,
        max_rows: usize,
        steps: u32,
    ) -> Result<Self, AgentError> {
        let gpu = |e: octoflow_model::ModelError| AgentError::Gpu(e.to_string());
        if steps == 0 {
            return Err(AgentError::Gpu(
                "steps per submit must be at least 1".into(),
            ));
        }
        let n = config.instances;
        let mut batch = model.batch(n, n_ctx, max_rows).map_err(gpu)?;
        // instance i's KV blocks are slot i's whole context, laid out once
        let (slot_blocks, block_tables) = batch.contiguous_tables().map_err(gpu)?;
        let mut run = Run::new(program, config, tasks, &batch)?;
        run.set_device_sampling(true);
        if batch.max_outputs() < n {
            return Err(AgentError::Gpu(format!(
                "{n} instances but a step's logits hold {} rows: use fewer instances or more rows a step",
                batch.max_outputs()
            )));
        }
        let ctx = model.context().clone();
        let kernel = |e: octoflow_kernels::KernelError| AgentError::Gpu(e.to_string());
        let kernels = Kernels {
            interpret: VmInterpret::new(&ctx).map_err(kernel)?,
            plan: VmPlan::new(&ctx).map_err(kernel)?,
            advance: VmAdvance::new(&ctx).map_err(kernel)?,
            end: VmEndStep::new(&ctx).map_err(kernel)?,
            select: VmSelect::new(&ctx).map_err(kernel)?,
            gate: Gate::new(&ctx).map_err(kernel)?,
        };
        let cap = (n as u32)
            .saturating_mul(steps)
            .saturating_mul(EVENTS_PER_INSTANCE_STEP)
            .max(1024);
        let img = pack(&run, cap).map_err(|e| AgentError::Gpu(e.to_string()))?;
        let vk = |e: octoflow_vk::VkError| AgentError::Gpu(e.to_string());
        let parts: [(&str, &[u32]); 8] = [
            ("vm_hdr", &img.hdr),
            ("vm_prog", &img.prog),
            ("vm_inst", &img.inst),
            ("vm_arena", &img.arena),
            ("vm_tables", &img.tables),
            ("vm_queues", &img.queues),
            ("vm_boxes", &img.boxes),
            ("vm_events", &img.events),
        ];
        let mut state = Vec::with_capacity(8);
        let mut sizes = Vec::with_capacity(8);
        for (name, words) in parts {
            let bytes = 4 * words.len().max(1) as u64;
            let b = Buffer::new(&ctx, name, bytes, MemoryKind::DeviceLocal).map_err(vk)?;
            if words.is_empty() {
                ctx.fill(&b, 0, bytes, 0).map_err(vk)?;
            } else {
                ctx.upload(&b, 0, words).map_err(vk)?;
            }
            state.push(b);
            sizes.push(words.len());
        }
        let shape = RowShape {
            max_rows: max_rows as u32,
            max_out: n as u32,
            n_slots: n as u32,
            slot_blocks,
        };
        let (r, o) = (max_rows as u64, n as u64);
        let row_words = [
            2 * r + block_tables.len() as u64,
            r,
            o,
            r,
            o * u64::from(SAMPLER_WORDS),
            step_words(n as u32),
            r,
        ];
        let mut rows = Vec::with_capacity(row_words.len());
        for words in row_words {
            rows.push(
                Buffer::new(&ctx, "vm_rows", 4 * words.max(1), MemoryKind::DeviceLocal)
                    .map_err(vk)?,
            );
        }
        // the block tables after the row pairs vm_plan writes
        ctx.upload(&rows[0], 8 * r, &block_tables).map_err(vk)?;
        // The sampled tokens, then their log-probabilities (the sampler's second half).
        let tokens =
            Buffer::new(&ctx, "vm_tokens", 8 * o.max(1), MemoryKind::DeviceLocal).map_err(vk)?;
        let bounds = row_buckets(max_rows as u32);
        let skip = Buffer::new(
            &ctx,
            "vm_skip",
            4 * bounds.len() as u64,
            MemoryKind::DeviceLocal,
        )
        .map_err(vk)?;
        let dims = VmDims {
            instances: img.hdr[H_N as usize],
            queues: img.hdr[H_N_QUEUES as usize],
            boxes: img.hdr[H_N_BOXES as usize],
        };
        let mut me = GpuRun {
            run,
            ctx: ctx.clone(),
            batch,
            state,
            sizes,
            rows,
            tokens,
            skip,
            buckets: Vec::new(),
            kernels,
            dims,
            shape,
            chain: Chain::new(&ctx).map_err(vk)?,
            steps,
            done: false,
            profile: None,
        };
        for rows in bounds {
            let bucket = me.bucket(rows, shape)?;
            me.buckets.push(bucket);
        }
        me.chain = me.record()?;
        Ok(me)
    }

    /// Turns per-dispatch GPU timing on or off (the chain is recorded again); with it on,
    /// [`GpuRun::profile`] sums every submit's dispatch times per kernel.
    pub fn set_profiling(&mut self, on: bool) -> Result<(), AgentError> {
        if on && !self.ctx.caps().timestamps {
            return Err(AgentError::Gpu(format!(
                "{} has no compute timestamps; profiling is unavailable",
                self.ctx.caps().name
            )));
        }
        if on != self.profile.is_some() {
            self.profile = on.then(Vec::new);
            self.chain = self.record()?;
        }
        Ok(())
    }

    /// GPU time per kernel over the submits since profiling was turned on, largest first.
    pub fn profile(&self) -> Option<&[LabelTime]> {
        self.profile.as_deref()
    }

    fn buffers(&self) -> VmBuffers {
        let w = |i: usize| self.state[i].whole();
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

    fn row_tables(&self) -> VmRows {
        let t = |i: usize| self.rows[i].whole();
        VmRows {
            table: t(0),
            ids: t(1),
            out_rows: t(2),
            mix: t(3),
            states: t(4),
            step: t(5),
            owners: t(6),
        }
    }

    /// The chain of `self.steps` steps.
    fn record(&self) -> Result<Chain, AgentError> {
        let (k, dims, shape) = (&self.kernels, self.dims, self.shape);
        let vk = |e: octoflow_vk::VkError| AgentError::Gpu(e.to_string());
        let kernel = |e: octoflow_kernels::KernelError| AgentError::Gpu(e.to_string());
        let (state, rows) = (self.buffers(), self.row_tables());
        let device_rows = DeviceRows {
            table: rows.table.clone(),
            ids: rows.ids.clone(),
            out_rows: rows.out_rows.clone(),
            mix: rows.mix.clone(),
            states: rows.states.clone(),
            tokens: self.tokens.whole(),
            logprobs_at: shape.max_out,
            mask: None,
        };
        let mut chain = if self.profile.is_some() {
            Chain::with_profiling(&self.ctx)
        } else if self.ctx.caps().timestamps {
            Chain::with_span_timing(&self.ctx)
        } else {
            Chain::new(&self.ctx)
        }
        .map_err(vk)?;
        // after the host's writes of the header (the ring reset) and the previous submit
        chain.barrier().map_err(vk)?;
        for _ in 0..self.steps {
            chain.set_scope(Some("vm"));
            k.interpret
                .record(&mut chain, &state, dims)
                .map_err(kernel)?;
            chain.compute_barrier().map_err(vk)?;
            k.plan
                .record(&mut chain, &state, dims.instances, &rows, shape)
                .map_err(kernel)?;
            chain.compute_barrier().map_err(vk)?;
            let bounds: Vec<u32> = self.buckets.iter().map(|b| b.rows).collect();
            k.select
                .record(&mut chain, &rows.step, &bounds, &self.skip.whole())
                .map_err(kernel)?;
            chain.compute_barrier().map_err(vk)?;
            for (j, b) in self.buckets.iter().enumerate() {
                k.gate
                    .record(
                        &mut chain,
                        &self.skip.whole(),
                        j as u32,
                        &b.template.whole(),
                        &b.args.whole(),
                        b.words,
                    )
                    .map_err(kernel)?;
            }
            // the arguments' writes before the indirect dispatches read them
            chain.barrier().map_err(vk)?;
            // One bucket's forward runs: its rows past the step's count are padding (the
            // spare KV slot), outputs past it sample row 0 greedily and are not read.
            for b in &self.buckets {
                chain.set_scope(Some(&format!("rows{}", b.rows)));
                chain.gate_begin(&b.args).map_err(vk)?;
                self.forward(&mut chain, &device_rows, b.rows, shape)?;
                let groups = chain.gate_end().map_err(vk)?;
                if gate_words(&groups).len() != b.words as usize {
                    return Err(AgentError::Gpu(format!(
                        "the forward of {} rows recorded {} dispatches, its probe {}",
                        b.rows,
                        groups.len(),
                        b.words / 3
                    )));
                }
            }
            chain.compute_barrier().map_err(vk)?;
            chain.set_scope(Some("vm"));
            k.advance
                .record(
                    &mut chain,
                    &state,
                    dims.instances,
                    &rows.step,
                    &self.tokens.whole(),
                    shape.max_out,
                )
                .map_err(kernel)?;
            chain.compute_barrier().map_err(vk)?;
            k.end
                .record(&mut chain, &state, dims.instances, &rows.step)
                .map_err(kernel)?;
            chain.compute_barrier().map_err(vk)?;
        }
        chain.set_scope(None);
        chain.finish().map_err(vk)?;
        Ok(chain)
    }

    /// The batched forward over `rows` rows of the tables (at most one output per row and
    /// per instance).
    fn forward(
        &self,
        chain: &mut Chain,
        device_rows: &DeviceRows,
        rows: u32,
        shape: RowShape,
    ) -> Result<(), AgentError> {
        self.batch
            .record_rows(chain, device_rows, rows, rows.min(shape.max_out))
            .map_err(|e| AgentError::Gpu(e.to_string()))?;
        Ok(())
    }

    /// The gated span of the forward over `rows` rows: a probe recording gives its
    /// dispatches' workgroup counts (the same in every step), uploaded as the template.
    fn bucket(&self, rows: u32, shape: RowShape) -> Result<Bucket, AgentError> {
        let vk = |e: octoflow_vk::VkError| AgentError::Gpu(e.to_string());
        let rt = self.row_tables();
        let device_rows = DeviceRows {
            table: rt.table,
            ids: rt.ids,
            out_rows: rt.out_rows,
            mix: rt.mix,
            states: rt.states,
            tokens: self.tokens.whole(),
            logprobs_at: shape.max_out,
            mask: None,
        };
        let mut probe = Chain::new(&self.ctx).map_err(vk)?;
        self.forward(&mut probe, &device_rows, rows, shape)?;
        let dispatches = probe.dispatch_count() as u64;
        let args = Buffer::new(
            &self.ctx,
            "vm_gate_args",
            12 * dispatches.max(1),
            MemoryKind::DeviceLocal,
        )
        .map_err(vk)?;
        let mut probe = Chain::new(&self.ctx).map_err(vk)?;
        probe.gate_begin(&args).map_err(vk)?;
        self.forward(&mut probe, &device_rows, rows, shape)?;
        let words = gate_words(&probe.gate_end().map_err(vk)?);
        let template = Buffer::new(
            &self.ctx,
            "vm_gate_template",
            4 * words.len().max(1) as u64,
            MemoryKind::DeviceLocal,
        )
        .map_err(vk)?;
        if !words.is_empty() {
            self.ctx.upload(&template, 0, &words).map_err(vk)?;
        }
        Ok(Bucket {
            rows,
            template,
            args,
            words: words.len() as u32,
        })
    }

    /// Runs one submit of `steps` steps and reads the state back into the host mirror.
    pub fn submit(&mut self) -> Result<SubmitReport, AgentError> {
        let vk = |e: octoflow_vk::VkError| AgentError::Gpu(e.to_string());
        if self.done {
            return Err(AgentError::Gpu("the run is over".into()));
        }
        let hdr = &self.state[0];
        self.ctx
            .upload(hdr, 4 * u64::from(H_EV_HEAD), &[0u32, 0, 0])
            .map_err(vk)?;
        debug_assert_eq!((H_EV_READ, H_EV_LOST), (H_EV_HEAD + 1, H_EV_HEAD + 2));
        self.chain.run().map_err(vk)?;
        let gpu_ns = match self.profile.as_mut() {
            Some(total) => {
                let times = self.chain.timings().map_err(vk)?.unwrap_or_default();
                let ns = times.iter().map(|t| t.ns).sum::<f64>();
                for t in summarize(&times) {
                    match total.iter_mut().find(|l| l.label == t.label) {
                        Some(l) => {
                            l.count += t.count;
                            l.total_ns += t.total_ns;
                            l.floor_ns = l.floor_ns.zip(t.floor_ns).map(|(a, b)| a + b);
                        }
                        None => total.push(t),
                    }
                }
                total.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
                Some(ns)
            }
            None => self.chain.span_ns().map_err(vk)?,
        };
        let image = self.download()?;
        let h = |at: u32| image.hdr[at as usize];
        let stalled = h(H_STALLED) != 0;
        let live = h(H_LIVE);
        let events = unpack(&mut self.run, &image).map_err(|e| AgentError::Gpu(e.to_string()))?;
        if stalled {
            self.done = true;
            return Err(AgentError::Deadlock(self.run.deadlock_report()));
        }
        self.done = live == 0;
        Ok(SubmitReport {
            steps: self.steps,
            live,
            events,
            gpu_ns,
        })
    }

    /// The state's words: the header first (for the arena's used length), then every buffer
    /// but the arena whole, and the arena's used part.
    fn download(&self) -> Result<VmImage, AgentError> {
        let vk = |e: octoflow_vk::VkError| AgentError::Gpu(e.to_string());
        let read = |i: usize, words: usize| -> Result<Vec<u32>, AgentError> {
            let mut out = vec![0u32; words];
            if words > 0 {
                self.ctx.download(&self.state[i], 0, &mut out).map_err(vk)?;
            }
            Ok(out)
        };
        let hdr = read(0, H_WORDS as usize)?;
        let used = (hdr[octoflow_kernels::agents::layout::H_ARENA_USED as usize] as usize)
            .min(self.sizes[3]);
        Ok(VmImage {
            hdr,
            prog: read(1, self.sizes[1])?,
            inst: read(2, self.sizes[2])?,
            arena: read(3, used)?,
            tables: read(4, self.sizes[4])?,
            queues: read(5, self.sizes[5])?,
            boxes: read(6, self.sizes[6])?,
            events: read(7, self.sizes[7])?,
        })
    }

    /// Whether every instance halted or failed.
    pub fn finished(&self) -> bool {
        self.done
    }

    /// The host mirror: the run as of the last submit.
    pub fn run(&self) -> &Run {
        &self.run
    }

    /// Steps per submit.
    pub fn steps_per_submit(&self) -> u32 {
        self.steps
    }

    /// The batched engine the forward passes run on (its KV caches hold the instances').
    pub fn engine(&self) -> &dyn BatchForward {
        &self.batch
    }
}
