//! A run on the GPU: the VM's state lives on the device and one chain holds `K` whole steps —
//! interpret, plan, the batched forward over the rows the plan wrote, advance, end of step —
//! then `vm_drain` moves the chain's events, their outputs' tokens and the header into the
//! chain's host-visible outbox and empties the event ring. There are two such chains with an
//! outbox each: while the GPU runs one, the host reads the other's outbox (and the next chain
//! is already queued behind it), so the GPU never waits for the host between chains and the
//! state is never downloaded mid-run.
//!
//! The host [`Run`] is the mirror the whole state is unpacked into when the run ends (or
//! deadlocks): its instances' statuses, spans and deadlock report are the GPU's. The sampler
//! writes each token's log-probability beside it, so spans carry scores and `best` runs here
//! too.

use octoflow_kernels::agents::layout::{
    EVENT_WORDS, H_ARENA_USED, H_LIVE, H_N, H_N_BOXES, H_N_QUEUES, H_STALLED, H_STEP_HI, H_STEP_LO,
    H_WORDS, O_EVENTS, O_EVENTS_N, O_GEN_HI, O_GEN_LO, O_OVERFLOW, O_TOKENS_N, SAMPLER_WORDS,
};
use octoflow_kernels::agents::vm_drain::outbox_words;
use octoflow_kernels::agents::vm_plan::RowShape;
use octoflow_kernels::agents::vm_select::row_buckets;
use octoflow_kernels::agents::{
    step_words, VmAdvance, VmBuffers, VmDims, VmDrain, VmEndStep, VmInterpret, VmPlan, VmRows,
    VmSelect,
};
use octoflow_kernels::gate::Gate;
use octoflow_model::gpu::{DeviceRows, GpuBatch, GpuModel};
use octoflow_model::BatchForward;
use octoflow_vk::{gate_words, summarize, Buffer, Chain, Context, LabelTime, MemoryKind};

use crate::error::AgentError;
use crate::event::Event;
use crate::gpu_state::{outbox_events, pack, unpack, VmImage};
use crate::program::Program;
use crate::run::{Run, RunConfig};

/// Event records the ring holds per instance and step of a chain: an instance emits at most a
/// few times a step in the shipped programs; a ring that overflows fails the run (never loses
/// an output silently).
const EVENTS_PER_INSTANCE_STEP: u32 = 2;

/// Tokens an outbox gathers at most per chain: more (many long outputs in one chain) leave
/// them in the arena, which the host then reads whole.
const OUTBOX_TOKENS_PER_INSTANCE: u32 = 256;

/// How often the host checks the chain it waits for: short against a chain of K steps (a few
/// milliseconds at the least), long enough that checking costs the host next to nothing.
const WAKE_INTERVAL: std::time::Duration = std::time::Duration::from_micros(200);

/// What one chain did.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmitReport {
    /// Steps the chain ran.
    pub steps: u32,
    /// Steps the run has run so far.
    pub step: u64,
    /// Tokens generated so far, over all instances.
    pub generated: u64,
    /// Instances neither halted nor failed afterwards.
    pub live: u32,
    /// The outputs and errors of those steps, in ring order.
    pub events: Vec<Event>,
    /// The chain's GPU time in nanoseconds, from timestamps (`None` where the device has
    /// none): summed over submits against the wall time, how busy the host kept the GPU.
    pub gpu_ns: Option<f64>,
}

fn vk(e: octoflow_vk::VkError) -> AgentError {
    AgentError::Gpu(e.to_string())
}

/// The VM's kernels, built once per device.
struct Kernels {
    interpret: VmInterpret,
    plan: VmPlan,
    advance: VmAdvance,
    end: VmEndStep,
    select: VmSelect,
    drain: VmDrain,
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
    /// The two chains (identical but for their outboxes) and their outboxes.
    chains: Vec<Chain>,
    outboxes: Vec<Buffer>,
    /// Events the ring holds, tokens an outbox holds.
    ev_cap: u32,
    token_cap: u32,
    /// Chains submitted and not yet read, oldest first; the chain to submit next.
    in_flight: std::collections::VecDeque<usize>,
    next: usize,
    steps: u32,
    done: bool,
    /// The last chain read found the run stalled.
    stalled: bool,
    /// Chains submitted so far.
    submits: u64,
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
            drain: VmDrain::new(&ctx).map_err(kernel)?,
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
        let token_cap = (n as u32)
            .saturating_mul(OUTBOX_TOKENS_PER_INSTANCE)
            .clamp(4096, 1 << 22);
        let mut outboxes = Vec::with_capacity(2);
        for _ in 0..2 {
            let bytes = 4 * outbox_words(cap, token_cap);
            outboxes.push(Buffer::new(&ctx, "vm_outbox", bytes, MemoryKind::Readback).map_err(vk)?);
        }
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
            chains: Vec::new(),
            outboxes,
            ev_cap: cap,
            token_cap,
            in_flight: Default::default(),
            next: 0,
            steps,
            done: false,
            stalled: false,
            submits: 0,
            profile: None,
        };
        for rows in bounds {
            let bucket = me.bucket(rows, shape)?;
            me.buckets.push(bucket);
        }
        me.chains = vec![me.record(0)?, me.record(1)?];
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
        if !self.in_flight.is_empty() || self.submits > 0 {
            return Err(AgentError::Gpu(
                "profiling is switched before the first submit".into(),
            ));
        }
        if on != self.profile.is_some() {
            self.profile = on.then(Vec::new);
            self.chains = vec![self.record(0)?, self.record(1)?];
        }
        Ok(())
    }

    /// Sets how many tokens a chain's outbox gathers (chains are recorded again; before the
    /// first submit). A chain whose outputs hold more leaves them in the arena, and the host
    /// downloads its used part instead: correct, but a transfer that waits for the GPU.
    pub fn set_outbox_tokens(&mut self, tokens: u32) -> Result<(), AgentError> {
        if !self.in_flight.is_empty() || self.submits > 0 {
            return Err(AgentError::Gpu(
                "the outbox is sized before the first submit".into(),
            ));
        }
        let bytes = 4 * outbox_words(self.ev_cap, tokens);
        self.outboxes = (0..2)
            .map(|_| Buffer::new(&self.ctx, "vm_outbox", bytes, MemoryKind::Readback))
            .collect::<Result<_, _>>()
            .map_err(vk)?;
        self.token_cap = tokens;
        self.chains = vec![self.record(0)?, self.record(1)?];
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

    /// The chain of `self.steps` steps draining into outbox `which`.
    fn record(&self, which: usize) -> Result<Chain, AgentError> {
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
        // after the previous chain's work (it may still run when this one is submitted)
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
        k.drain
            .record(
                &mut chain,
                &state,
                dims.instances,
                self.ev_cap,
                &self.outboxes[which].whole(),
                self.token_cap,
            )
            .map_err(kernel)?;
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

    /// Waits for the oldest chain in flight and returns what it did; before waiting, keeps
    /// two chains submitted, so the GPU runs the next while the host reads this one's outbox.
    /// When a chain ends the run (no instance live) or finds it stalled, the chains still in
    /// flight are waited for, the whole state is read back into the host mirror
    /// ([`GpuRun::run`]) and the run is over ([`GpuRun::finished`]; a stall is
    /// [`AgentError::Deadlock`]).
    pub fn submit(&mut self) -> Result<SubmitReport, AgentError> {
        if self.done {
            return Err(AgentError::Gpu("the run is over".into()));
        }
        while self.in_flight.len() < 2 {
            let c = self.next;
            self.chains[c].submit().map_err(vk)?;
            self.submits += 1;
            self.in_flight.push_back(c);
            self.next = 1 - c;
        }
        let mut report = self.read_next()?;
        let stalled = self.stalled;
        if report.live == 0 || stalled {
            // the chains behind it ran on a finished or stalled state: nothing more happens
            while !self.in_flight.is_empty() {
                let more = self.read_next()?;
                report.events.extend(more.events);
                report.gpu_ns = report.gpu_ns.zip(more.gpu_ns).map(|(a, b)| a + b);
            }
            self.done = true;
            let image = self.download()?;
            unpack(&mut self.run, &image).map_err(|e| AgentError::Gpu(e.to_string()))?;
            if stalled {
                return Err(AgentError::Deadlock(self.run.deadlock_report()));
            }
        }
        Ok(report)
    }

    /// Waits for the oldest chain in flight and decodes its outbox.
    fn read_next(&mut self) -> Result<SubmitReport, AgentError> {
        let c = self
            .in_flight
            .pop_front()
            .ok_or_else(|| AgentError::Gpu("no chain in flight".into()))?;
        let chain = &mut self.chains[c];
        // asleep: the other chain is queued behind this one, so the device does not wait for
        // the host to wake (the host is the power button, not a spinning core)
        chain.wait_sleeping(WAKE_INTERVAL).map_err(vk)?;
        let gpu_ns = match self.profile.as_mut() {
            Some(total) => {
                let times = chain.timings().map_err(vk)?.unwrap_or_default();
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
            None => chain.span_ns().map_err(vk)?,
        };
        let outbox = &self.outboxes[c];
        let mut counts = vec![0u32; O_EVENTS as usize];
        outbox.read(0, &mut counts).map_err(vk)?;
        let n_ev = counts[O_EVENTS_N as usize].min(self.ev_cap) as usize;
        let mut head = counts.clone();
        head.resize(O_EVENTS as usize + n_ev * EVENT_WORDS as usize, 0);
        outbox
            .read(4 * u64::from(O_EVENTS), &mut head[O_EVENTS as usize..])
            .map_err(vk)?;
        let tokens = if counts[O_OVERFLOW as usize] != 0 {
            // not gathered: the arena (which only grows) still holds them
            self.arena_tokens()?
        } else {
            let n = counts[O_TOKENS_N as usize].min(self.token_cap) as usize;
            let at = u64::from(O_EVENTS) + u64::from(self.ev_cap) * u64::from(EVENT_WORDS);
            let mut t = vec![0u32; n];
            if n > 0 {
                outbox.read(4 * at, &mut t).map_err(vk)?;
            }
            t
        };
        let events =
            outbox_events(&self.run, &head, &tokens).map_err(|e| AgentError::Gpu(e.to_string()))?;
        let h = |at: u32| counts[at as usize];
        self.stalled = h(H_STALLED) != 0;
        Ok(SubmitReport {
            steps: self.steps,
            step: u64::from(h(H_STEP_LO)) | (u64::from(h(H_STEP_HI)) << 32),
            generated: u64::from(h(O_GEN_LO)) | (u64::from(h(O_GEN_HI)) << 32),
            live: h(H_LIVE),
            events,
            gpu_ns,
        })
    }

    /// The arena's used length by header words `hdr` (at most its buffer).
    fn arena_used(&self, hdr: &[u32]) -> usize {
        (hdr[H_ARENA_USED as usize] as usize).min(self.sizes[3])
    }

    /// The arena's used tokens, downloaded.
    fn arena_tokens(&self) -> Result<Vec<u32>, AgentError> {
        let mut hdr = vec![0u32; H_WORDS as usize];
        self.ctx.download(&self.state[0], 0, &mut hdr).map_err(vk)?;
        let used = self.arena_used(&hdr);
        let mut out = vec![0u32; used];
        if used > 0 {
            self.ctx.download(&self.state[3], 0, &mut out).map_err(vk)?;
        }
        Ok(out)
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
        let used = self.arena_used(&hdr);
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

    /// The host mirror: the run as it started, and once [`GpuRun::finished`], as it ended.
    pub fn run(&self) -> &Run {
        &self.run
    }

    /// Chains submitted so far (one more than read while the run goes on: the next is
    /// queued behind the one being read).
    pub fn submits(&self) -> u64 {
        self.submits
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
