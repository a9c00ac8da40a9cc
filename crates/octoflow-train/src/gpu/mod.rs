//! The training step on the GPU.
//!
//! One micro-step (forward, loss, backward of `batch × seq_len` rows) is recorded once into one
//! chain and replayed for every micro-batch: the CPU writes the rows' token ids, labels, loss
//! weights, positions and the dropout seed into a small upload buffer, submits, and reads the
//! per-row losses back. Gradients accumulate in one flat buffer across micro-steps; the
//! optimizer step (global gradient norm, clipping, AdamW) is a second, three-dispatch chain
//! recorded per optimizer step because its learning rate is a push constant.
//!
//! One trainer may run several fine-tunes at once, its members (`member.rs`): one chain per
//! micro-step over their stacked rows ([`Trainer::stage`], [`Trainer::submit_staged`],
//! [`Trainer::take_loss`]). Separate trainers can also share one upload of the base: each
//! holds an `Arc<GpuModel>` (read only) and may submit to its own queue
//! ([`Trainer::set_queue`]).
//!
//! Memory: the residual stream entering every layer is kept (`(n_layer + 1) × T × n_embd`); the
//! rest of a layer's activations are recomputed from it during the backward (one layer at a
//! time), so activation memory is one layer's worth plus the saved residuals. The vocabulary
//! projection, the cross-entropy and its input gradient run in chunks of rows so a 150k
//! vocabulary never needs `T × n_vocab` logits at once.

mod block;
mod layer;
mod member;
mod ops;
mod transposed;

pub use transposed::TransposedWeights;

use std::sync::Arc;

use octoflow_kernels::{
    AdamW, AdamWStep, CrossEntropy, Dropout, Gemm, GluBack, LinearT, MaskedSoftmax, RmsNormBack,
    SplitSum, SumSquares,
};
use octoflow_model::gpu::GpuModel;
use octoflow_model::ModelConfig;
use octoflow_vk::{summarize, Buffer, Chain, Context, LabelTime, MemoryKind};

use crate::error::{Result, TrainError};
use crate::lora::{LoraConfig, LoraLayout};
use member::{check_members, Member, Scratch};

/// Distinct dropout salts per layer (one per target kind): the mask of `target` in `layer` has
/// salt `layer * TARGET_SLOTS + target as usize`.
pub const TARGET_SLOTS: usize = 8;

/// Logit rows per cross-entropy chunk, at most (fewer when `n_vocab` is large: the chunk's
/// logits stay under [`LOGITS_BYTES`]).
const LOGITS_ROWS: usize = 256;
/// Bytes of logits per chunk, at most.
const LOGITS_BYTES: usize = 96 << 20;

/// The kernels only training uses (the forward ones come from the model).
pub(crate) struct TrainKernels {
    pub gemm: Gemm,
    pub linear_t: LinearT,
    pub cross_entropy: CrossEntropy,
    pub rms_norm_back: RmsNormBack,
    pub glu_back: GluBack,
    pub softmax: MaskedSoftmax,
    pub sum_squares: SumSquares,
    pub adamw: AdamW,
    pub dropout: Dropout,
    pub split_sum: SplitSum,
}

impl TrainKernels {
    fn new(ctx: &Context) -> Result<Self> {
        Ok(Self {
            gemm: Gemm::new(ctx)?,
            linear_t: LinearT::new(ctx)?,
            cross_entropy: CrossEntropy::new(ctx)?,
            rms_norm_back: RmsNormBack::new(ctx)?,
            glu_back: GluBack::new(ctx)?,
            softmax: MaskedSoftmax::new(ctx)?,
            sum_squares: SumSquares::new(ctx)?,
            adamw: AdamW::new(ctx)?,
            dropout: Dropout::new(ctx)?,
            split_sum: SplitSum::new(ctx)?,
        })
    }
}

/// Word offsets of the per-micro-step inputs in the upload buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IoLayout {
    pub ids: usize,
    pub labels: usize,
    pub weights: usize,
    /// `(position, 0)` pairs (the `Positions::Table` layout rope reads).
    pub pos: usize,
    /// One dropout seed per member.
    pub seed: usize,
    pub words: usize,
}

impl IoLayout {
    fn new(rows: usize, members: usize) -> Self {
        IoLayout {
            ids: 0,
            labels: rows,
            weights: 2 * rows,
            pos: 3 * rows,
            seed: 5 * rows,
            words: 5 * rows + members,
        }
    }
}

/// The device buffers of a trainer.
pub(crate) struct Bufs {
    pub io: Buffer,
    pub loss: Buffer,
    /// `[T, n_embd]` residual stream entering layer `l` (`xs[n_layer]`: the final one).
    pub xs: Vec<Buffer>,
    pub n1: Buffer,
    pub q: Buffer,
    pub k: Buffer,
    pub v: Buffer,
    /// q and k before their per-head norms (gemma3).
    pub q_raw: Buffer,
    pub k_raw: Buffer,
    /// `[batch, n_head, seq_len, seq_len]` attention probabilities.
    pub scores: Buffer,
    pub att: Buffer,
    /// Attention/FFN projections before their post-norms (gemma3) and after.
    pub a_raw: Buffer,
    pub a: Buffer,
    pub xmid: Buffer,
    pub n2: Buffer,
    pub g: Buffer,
    pub u: Buffer,
    pub hg: Buffer,
    pub f_raw: Buffer,
    pub f: Buffer,
    /// Per member, `[TARGETS][rows, rank]`: each adapter's `x Aᵀ`.
    pub h: Buffer,
    /// `[T, max n_in]`: dropout-masked adapter inputs / masked input gradients.
    pub xd: Buffer,
    pub dh: Buffer,
    pub dx: Buffer,
    pub dtmp: Buffer,
    pub dn: Buffer,
    pub datt: Buffer,
    pub dq: Buffer,
    pub dk: Buffer,
    pub dv: Buffer,
    pub dscores: Buffer,
    pub dhg: Buffer,
    pub logits: Buffer,
    pub nf: Buffer,
    pub dnf: Buffer,
    /// Partial sums of products split along k (`ops.rs`, `split_k`).
    pub part: Buffer,
}

/// Shapes and adapters of a trainer.
#[derive(Debug, Clone)]
pub struct TrainerOptions {
    /// Sequences per micro-batch.
    pub batch: usize,
    /// Rows per sequence.
    pub seq_len: usize,
    pub lora: LoraConfig,
}

/// One micro-batch: `batch × seq_len` rows, sequence after sequence.
#[derive(Debug, Clone, Default)]
pub struct Rows {
    pub ids: Vec<u32>,
    /// The id row `t` is trained to predict, or `octoflow_kernels::IGNORE`.
    pub labels: Vec<u32>,
    /// Per-row loss weight (1 / trained rows of the whole optimizer step; 0 for ignored rows).
    pub weights: Vec<f32>,
    /// Position of the row within its own document (attention never crosses documents).
    pub pos: Vec<u32>,
}

impl Rows {
    /// Checks a micro-batch against a trainer of `n` rows over `n_vocab` tokens.
    pub fn check(&self, n: usize, n_vocab: usize) -> Result<()> {
        for (what, len) in [
            ("ids", self.ids.len()),
            ("labels", self.labels.len()),
            ("weights", self.weights.len()),
            ("pos", self.pos.len()),
        ] {
            if len != n {
                return Err(TrainError::Config(format!(
                    "micro-batch {what}: {len} rows, the trainer runs {n}"
                )));
            }
        }
        if let Some(&id) = self.ids.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(TrainError::Config(format!(
                "token id {id} is outside the vocabulary ({n_vocab})"
            )));
        }
        Ok(())
    }
}

/// A LoRA trainer over one GPU copy of the frozen model (shared: several trainers may hold
/// the same `Arc<GpuModel>`). It trains one fine-tune ([`Trainer::new`]) or several at once
/// whose rows share every frozen product ([`Trainer::joint`], `member.rs`); the methods without
/// a member index act on member 0.
pub struct Trainer {
    pub(crate) gm: Arc<GpuModel>,
    pub(crate) c: ModelConfig,
    pub(crate) tk: TrainKernels,
    pub(crate) members: Vec<Member>,
    /// Sequences per stacked micro-batch (all members').
    pub(crate) batch: usize,
    /// Rows per sequence (the longest member's).
    pub(crate) seq_len: usize,
    /// `batch × seq_len`.
    pub(crate) rows: usize,
    pub(crate) logit_rows: usize,
    pub(crate) io: IoLayout,
    pub(crate) b: Bufs,
    step_chain: Option<Chain>,
    eval_chain: Option<Chain>,
    /// `Wᵀ` in f16 of the frozen matrices: the input gradients then run as forward products.
    pub(crate) transposed: Option<Arc<TransposedWeights>>,
    /// The queue every chain of this trainer submits to.
    queue: usize,
    /// Each member's micro-batch (in the stacked layout) and seed for the next submit.
    staged: Vec<Option<(Rows, u32)>>,
    /// The members that had rows in the micro-step in flight.
    in_flight: Vec<bool>,
    /// A micro-step was submitted and not yet waited for.
    pending: bool,
    /// Each member's per-row losses of its last finished micro-step, until taken.
    losses: Vec<Option<Vec<f32>>>,
    state_bytes: u64,
}

fn buffer(ctx: &Context, name: &str, floats: usize) -> Result<Buffer> {
    Ok(Buffer::new(
        ctx,
        name,
        4 * floats.max(4) as u64,
        MemoryKind::DeviceLocal,
    )?)
}

impl Trainer {
    /// Allocates every buffer for `opts` and builds the training pipelines. `gm` is a
    /// `GpuModel` or an `Arc` of one that other trainers share (the weights are only read).
    pub fn new(gm: impl Into<Arc<GpuModel>>, opts: &TrainerOptions) -> Result<Self> {
        Self::joint(gm, std::slice::from_ref(opts))
    }

    /// A trainer of several fine-tunes at once over the same base, member `i` per
    /// `members[i]` (rank, targets, dropout, batch and sequence length may all differ): one
    /// chain per micro-step runs them all, their rows stacked in the frozen products
    /// (`member.rs`). Each member has its own adapters, gradients and AdamW moments.
    pub fn joint(gm: impl Into<Arc<GpuModel>>, members: &[TrainerOptions]) -> Result<Self> {
        let gm: Arc<GpuModel> = gm.into();
        check_members(members)?;
        let c = gm.config.clone();
        if let Some(missing) = c.blocks.iter().find_map(|b| b.train_missing()) {
            // the inference graph runs these; the training step's forward and backward do not
            return Err(octoflow_model::ModelError::Unsupported(format!(
                "{} has {missing}, which the training step does not run yet",
                c.arch
            ))
            .into());
        }
        let ctx = gm.context().clone();
        let seq_len = members.iter().map(|o| o.seq_len).max().unwrap_or(2);
        let batch: usize = members.iter().map(|o| o.batch).sum();
        let rows = batch * seq_len;
        // a multiple of 4 rows, so every chunk's slice of the per-row losses starts 16-byte
        // aligned (the last chunk may be shorter)
        let logit_rows = (LOGITS_BYTES / (4 * c.n_vocab)).clamp(4, LOGITS_ROWS) / 4 * 4;
        let io = IoLayout::new(rows, members.len());
        let (d, ff) = (c.n_embd, c.n_ff);
        let (qd, kd, vd) = (c.q_dim(), c.k_dim(), c.v_dim());
        let att_w = c.n_head * c.head_dim_v;
        let max_in = d.max(ff).max(att_w);
        let max_side = max_in.max(qd).max(kd).max(vd);
        let sc = batch * c.n_head * seq_len * seq_len;
        let before = ctx.memory_usage().0;
        let mut at = Scratch {
            h: 0,
            dh: 0,
            part: 0,
        };
        let mut row0 = 0;
        let mut ms = Vec::with_capacity(members.len());
        for (i, o) in members.iter().enumerate() {
            let layout = LoraLayout::new(&o.lora, &c);
            let m = Member::new(&ctx, i, o, layout, row0, seq_len, max_side, &mut at)?;
            row0 += m.rows;
            ms.push(m);
        }
        let bf = |name: &str, n: usize| buffer(&ctx, name, n);
        // the raw projections the backward reads exist only where some block's plan norms them
        let qk_norm = c.blocks.iter().any(|b| b.attn.qk_norm);
        let post_attn = c.blocks.iter().any(|b| b.attn.post_norm);
        let post_ffw = c.blocks.iter().any(|b| b.glu().is_ok_and(|g| g.post_norm));
        let b = Bufs {
            io: Buffer::new(&ctx, "train.io", 4 * io.words as u64, MemoryKind::Upload)?,
            loss: Buffer::new(&ctx, "train.loss", 4 * rows as u64, MemoryKind::Readback)?,
            xs: (0..=c.n_layer)
                .map(|l| bf(&format!("train.x{l}"), rows * d))
                .collect::<Result<_>>()?,
            n1: bf("train.n1", rows * d)?,
            q: bf("train.q", rows * qd)?,
            k: bf("train.k", rows * kd)?,
            v: bf("train.v", rows * vd)?,
            q_raw: bf("train.q_raw", if qk_norm { rows * qd } else { 1 })?,
            k_raw: bf("train.k_raw", if qk_norm { rows * kd } else { 1 })?,
            scores: bf("train.scores", sc)?,
            att: bf("train.att", rows * att_w)?,
            a_raw: bf("train.a_raw", if post_attn { rows * d } else { 1 })?,
            a: bf("train.a", rows * d)?,
            xmid: bf("train.xmid", rows * d)?,
            n2: bf("train.n2", rows * d)?,
            g: bf("train.g", rows * ff)?,
            u: bf("train.u", rows * ff)?,
            hg: bf("train.hg", rows * ff)?,
            f_raw: bf("train.f_raw", if post_ffw { rows * d } else { 1 })?,
            f: bf("train.f", rows * d)?,
            h: bf("train.h", at.h)?,
            xd: bf("train.xd", rows * max_in)?,
            dh: bf("train.dh", at.dh)?,
            dx: bf("train.dx", rows * d)?,
            dtmp: bf("train.dtmp", rows * d)?,
            dn: bf("train.dn", rows * d)?,
            datt: bf("train.datt", rows * att_w)?,
            dq: bf("train.dq", rows * qd)?,
            dk: bf("train.dk", rows * kd)?,
            dv: bf("train.dv", rows * vd)?,
            dscores: bf("train.dscores", sc)?,
            dhg: bf("train.dhg", rows * ff)?,
            logits: bf("train.logits", logit_rows * c.n_vocab)?,
            nf: bf("train.nf", rows * d)?,
            dnf: bf("train.dnf", rows * d)?,
            part: bf("train.part", at.part)?,
        };
        let state_bytes = ctx.memory_usage().0.saturating_sub(before);
        let tk = TrainKernels::new(&ctx)?;
        let n = ms.len();
        let mut t = Trainer {
            gm,
            c,
            tk,
            members: ms,
            batch,
            seq_len,
            rows,
            logit_rows,
            io,
            b,
            step_chain: None,
            eval_chain: None,
            transposed: None,
            queue: 0,
            staged: vec![None; n],
            in_flight: vec![false; n],
            pending: false,
            losses: vec![None; n],
            state_bytes,
        };
        for g in 0..n {
            let init = t.members[g].layout.init(0);
            t.set_params_of(g, &init)?;
        }
        t.step_chain = Some(t.record(true)?);
        t.eval_chain = Some(t.record(false)?);
        Ok(t)
    }

    /// The device.
    pub fn context(&self) -> &Context {
        self.gm.context()
    }

    /// The shared base model.
    pub fn model(&self) -> &Arc<GpuModel> {
        &self.gm
    }

    /// Submits every chain of this trainer to queue `i` (modulo the device's queue count, see
    /// `octoflow_vk::Context::queue_count`), so trainers on different queues overlap on the GPU.
    /// The chains are recorded again: kernels may bind per-queue scratch (the split-K partial
    /// sums of `MatmulCoop`), which chains running at once on different queues must not share.
    pub fn set_queue(&mut self, i: usize) -> Result<()> {
        self.finish_pending()?;
        self.queue = i % self.context().queue_count();
        self.rerecord()
    }

    /// Takes the input gradients `dX = dY·W` through `t`'s f16 copies of `Wᵀ` (the forward's
    /// product kernel: cooperative matrices where the device has them) instead of through the
    /// quantized weights (`None`, the default). Worth it where [`Trainer::uses_coop`]: there
    /// the products' operands are f16 anyway. The chains are recorded again.
    pub fn set_transposed(&mut self, t: Option<Arc<TransposedWeights>>) -> Result<()> {
        self.finish_pending()?;
        self.transposed = t;
        self.rerecord()
    }

    fn rerecord(&mut self) -> Result<()> {
        self.step_chain = None;
        self.eval_chain = None;
        self.step_chain = Some(self.record(true)?);
        self.eval_chain = Some(self.record(false)?);
        Ok(())
    }

    /// Whether this trainer's products run on cooperative matrices (f16 operands).
    pub fn uses_coop(&self) -> bool {
        self.gm.kernels().linear.uses_coop(self.rows as u32)
    }

    /// The queue this trainer submits to.
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// Device bytes this trainer allocated itself: activations, adapters, gradients, optimizer
    /// state and I/O of every member (not the shared weights).
    pub fn state_bytes(&self) -> u64 {
        self.state_bytes
    }

    /// How many fine-tunes this trainer runs.
    pub fn members(&self) -> usize {
        self.members.len()
    }

    fn member(&self, g: usize) -> Result<&Member> {
        self.members.get(g).ok_or_else(|| {
            TrainError::Config(format!(
                "member {g}: the trainer has {}",
                self.members.len()
            ))
        })
    }

    /// Member 0's adapters' layout.
    pub fn layout(&self) -> &LoraLayout {
        &self.members[0].layout
    }

    /// Member `g`'s adapters' layout.
    pub fn layout_of(&self, g: usize) -> Result<&LoraLayout> {
        Ok(&self.member(g)?.layout)
    }

    /// Rows per micro-batch of member 0 (`batch × seq_len`).
    pub fn rows(&self) -> usize {
        self.members[0].batch * self.members[0].seq_len
    }

    /// Rows of one stacked micro-step (all members', padding included).
    pub fn stacked_rows(&self) -> usize {
        self.rows
    }

    /// Replaces member 0's adapters' parameters (`[layout.n_params]`).
    pub fn set_params(&self, p: &[f32]) -> Result<()> {
        self.set_params_of(0, p)
    }

    /// Replaces member `g`'s adapters' parameters.
    pub fn set_params_of(&self, g: usize, p: &[f32]) -> Result<()> {
        let m = self.member(g)?;
        m.layout.check_len("parameters", p.len())?;
        Ok(self.context().upload(&m.params, 0, p)?)
    }

    /// Member 0's adapters' parameters.
    pub fn params(&self) -> Result<Vec<f32>> {
        self.params_of(0)
    }

    /// Member `g`'s adapters' parameters.
    pub fn params_of(&self, g: usize) -> Result<Vec<f32>> {
        let m = self.member(g)?;
        self.read(m, &m.params)
    }

    /// Member 0's accumulated gradients (since its last optimizer step).
    pub fn grads(&self) -> Result<Vec<f32>> {
        self.grads_of(0)
    }

    /// Member `g`'s accumulated gradients.
    pub fn grads_of(&self, g: usize) -> Result<Vec<f32>> {
        let m = self.member(g)?;
        self.read(m, &m.grads)
    }

    /// Member 0's AdamW first and second moments.
    pub fn moments(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        self.moments_of(0)
    }

    /// Restores member 0's AdamW moments (resume).
    pub fn set_moments(&self, m: &[f32], v: &[f32]) -> Result<()> {
        self.set_moments_of(0, m, v)
    }

    /// Member `g`'s AdamW first and second moments.
    pub fn moments_of(&self, g: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let m = self.member(g)?;
        Ok((self.read(m, &m.m)?, self.read(m, &m.v2)?))
    }

    /// Restores member `g`'s AdamW moments (resume).
    pub fn set_moments_of(&self, g: usize, mo: &[f32], v: &[f32]) -> Result<()> {
        let m = self.member(g)?;
        m.layout.check_len("first moments", mo.len())?;
        m.layout.check_len("second moments", v.len())?;
        self.context().upload(&m.m, 0, mo)?;
        Ok(self.context().upload(&m.v2, 0, v)?)
    }

    fn read(&self, m: &Member, b: &Buffer) -> Result<Vec<f32>> {
        let mut out = vec![0f32; m.layout.n_params];
        self.context().download(b, 0, &mut out)?;
        Ok(out)
    }

    /// Writes the staged micro-batches (idle rows for members without one) into the upload
    /// buffer; returns which members had rows.
    fn write_staged(&mut self) -> Result<Vec<bool>> {
        let mut words = vec![0u32; self.io.words];
        let mut had = vec![false; self.members.len()];
        for (g, m) in self.members.iter().enumerate() {
            let (r, seed) = match self.staged[g].take() {
                Some(s) => {
                    had[g] = true;
                    s
                }
                None => (m.idle(), 0),
            };
            let at = m.row0;
            words[self.io.ids + at..][..m.rows].copy_from_slice(&r.ids);
            words[self.io.labels + at..][..m.rows].copy_from_slice(&r.labels);
            for (w, x) in words[self.io.weights + at..][..m.rows]
                .iter_mut()
                .zip(&r.weights)
            {
                *w = x.to_bits();
            }
            for (i, &p) in r.pos.iter().enumerate() {
                words[self.io.pos + 2 * (at + i)] = p;
            }
            words[self.io.seed + g] = seed;
        }
        self.b.io.write(0, &words)?;
        Ok(had)
    }

    /// Writes member `g`'s micro-batch `r` with idle rows for the others (an evaluation or a
    /// profiled step); micro-batches staged for the next micro-step stay staged.
    fn write_alone(&mut self, g: usize, r: &Rows, seed: u32) -> Result<()> {
        let placed = self.member(g)?.place(r, self.seq_len, self.c.n_vocab)?;
        let staged = std::mem::replace(&mut self.staged, vec![None; self.members.len()]);
        self.staged[g] = Some((placed, seed));
        let written = self.write_staged();
        self.staged = staged;
        written.map(|_| ())
    }

    /// Member `g`'s slice of the per-row losses.
    fn member_losses(&self, g: usize) -> Result<Vec<f32>> {
        let m = self.member(g)?;
        let mut loss = vec![0f32; m.rows];
        self.b.loss.read(4 * m.row0 as u64, &mut loss)?;
        Ok(loss)
    }

    /// Σ of per-row losses, refusing a non-finite one.
    fn loss_sum(loss: &[f32]) -> Result<f64> {
        if let Some(i) = loss.iter().position(|l| !l.is_finite()) {
            return Err(TrainError::NonFinite(format!(
                "the loss of row {i} is {}",
                loss[i]
            )));
        }
        Ok(loss.iter().map(|&l| f64::from(l)).sum())
    }

    /// Forward and backward of one micro-batch: gradients accumulate, the weighted loss sum
    /// (Σ weight × token loss) comes back. `seed` drives the dropout masks.
    /// [`Trainer::submit_micro`] then [`Trainer::finish_micro`].
    pub fn micro_step(&mut self, r: &Rows, seed: u32) -> Result<f64> {
        self.submit_micro(r, seed)?;
        self.finish_micro()
    }

    /// Writes a micro-batch of member 0 and submits its forward and backward without waiting
    /// (the other members, if any, sit the step out). Finish it with
    /// [`Trainer::finish_micro`] before touching this trainer's buffers (parameters,
    /// moments); `eval`, `optimizer_step` and `set_queue` wait for it themselves.
    pub fn submit_micro(&mut self, r: &Rows, seed: u32) -> Result<()> {
        self.stage(0, r, seed)?;
        self.submit_staged()
    }

    /// Stages member `g`'s next micro-batch (its own shape); [`Trainer::submit_staged`] runs
    /// every staged member's in one micro-step.
    pub fn stage(&mut self, g: usize, r: &Rows, seed: u32) -> Result<()> {
        if self.pending {
            return Err(TrainError::Config(
                "submit_micro: the previous micro-step was not finished".into(),
            ));
        }
        let placed = self.member(g)?.place(r, self.seq_len, self.c.n_vocab)?;
        self.staged[g] = Some((placed, seed));
        // an untaken loss of an earlier micro-step is dropped
        self.losses[g] = None;
        Ok(())
    }

    /// Submits one micro-step over every staged member's rows without waiting.
    pub fn submit_staged(&mut self) -> Result<()> {
        if self.pending {
            return Err(TrainError::Config(
                "submit_micro: the previous micro-step was not finished".into(),
            ));
        }
        if self.staged.iter().all(Option::is_none) {
            return Err(TrainError::Config(
                "submit: no micro-batch was staged".into(),
            ));
        }
        let had = self.write_staged()?;
        let chain = self.step_chain.as_mut().ok_or(TrainError::NoChain)?;
        chain.submit()?;
        self.in_flight = had;
        self.pending = true;
        Ok(())
    }

    /// Waits for the micro-step in flight, if any, and keeps each of its members' losses until
    /// [`Trainer::take_loss`], so the buffers are idle.
    fn finish_pending(&mut self) -> Result<()> {
        if !self.pending {
            return Ok(());
        }
        self.pending = false;
        let chain = self.step_chain.as_mut().ok_or(TrainError::NoChain)?;
        chain.wait()?;
        for g in 0..self.members.len() {
            if std::mem::take(&mut self.in_flight[g]) {
                self.losses[g] = Some(self.member_losses(g)?);
            }
        }
        Ok(())
    }

    /// Waits for the micro-step [`Trainer::submit_micro`] started and returns its weighted
    /// loss sum.
    pub fn finish_micro(&mut self) -> Result<f64> {
        self.take_loss(0)
    }

    /// Member `g`'s weighted loss sum of the micro-step it was last submitted in, waiting for
    /// that step if it is still running.
    pub fn take_loss(&mut self, g: usize) -> Result<f64> {
        self.member(g)?;
        if self.pending && self.in_flight[g] {
            self.finish_pending()?;
        }
        let loss = self.losses[g].take().ok_or_else(|| {
            TrainError::Config("finish_micro: no micro-step was submitted".into())
        })?;
        Self::loss_sum(&loss)
    }

    /// Whether a submitted micro-step has not been waited for.
    pub fn is_pending(&self) -> bool {
        self.pending
    }

    /// The weighted loss sum of a micro-batch of member 0 without touching the gradients.
    pub fn eval(&mut self, r: &Rows) -> Result<f64> {
        self.eval_of(0, r)
    }

    /// The weighted loss sum of member `g`'s micro-batch `r` without touching any gradient
    /// (evaluation; no dropout).
    pub fn eval_of(&mut self, g: usize, r: &Rows) -> Result<f64> {
        self.finish_pending()?;
        self.write_alone(g, r, 0)?;
        let chain = self.eval_chain.as_mut().ok_or(TrainError::NoChain)?;
        chain.run()?;
        Self::loss_sum(&self.member_losses(g)?)
    }

    /// One AdamW step over member 0's accumulated gradients.
    pub fn optimizer_step(&mut self, step: &AdamWStep) -> Result<f32> {
        self.optimizer_step_of(0, step)
    }

    /// One AdamW step over member `g`'s accumulated gradients (which it zeroes); returns the
    /// global gradient norm before clipping.
    pub fn optimizer_step_of(&mut self, g: usize, step: &AdamWStep) -> Result<f32> {
        self.finish_pending()?;
        let ctx = self.context().clone();
        let m = self.member(g)?;
        let n = m.layout.n_params as u32;
        let mut chain = Chain::new(&ctx)?;
        chain.set_queue(self.queue)?;
        let stats = m.stats.whole();
        self.tk
            .sum_squares
            .record(&mut chain, &m.grads.whole(), n, &stats, 0)?;
        chain.compute_barrier()?;
        let step = AdamWStep {
            zero_grads: true,
            ..*step
        };
        self.tk.adamw.record(
            &mut chain,
            &m.params.whole(),
            &m.grads.whole(),
            &m.m.whole(),
            &m.v2.whole(),
            &stats,
            0,
            n,
            &step,
        )?;
        chain.run()?;
        let mut ss = [0f32; 1];
        m.stats.read(0, &mut ss)?;
        Ok(ss[0].sqrt())
    }

    /// Device memory this process holds (weights, activations, adapters, optimizer state).
    pub fn device_bytes(&self) -> u64 {
        self.context().memory_usage().0
    }

    /// Runs one micro-step of member 0 on a chain that times every dispatch (GPU timestamps)
    /// and returns the time per kernel, largest first. Gradients accumulate as in
    /// [`Trainer::micro_step`].
    pub fn profile_step(&mut self, r: &Rows, seed: u32) -> Result<Vec<LabelTime>> {
        if !self.context().caps().timestamps {
            return Err(TrainError::Config(format!(
                "{} has no compute timestamps; profiling is unavailable",
                self.context().caps().name
            )));
        }
        self.finish_pending()?;
        self.write_alone(0, r, seed)?;
        let mut chain = Chain::with_profiling(self.context())?;
        chain.set_queue(self.queue)?;
        let mut chain = self.record_with(true, chain)?;
        chain.run()?;
        let times = chain.timings()?.unwrap_or_default();
        Ok(summarize(&times))
    }

    /// Records the micro-step chain (`train`: forward, loss, backward) or the evaluation one.
    fn record(&self, train: bool) -> Result<Chain> {
        let mut chain = Chain::new(self.context())?;
        chain.set_queue(self.queue)?;
        self.record_with(train, chain)
    }

    fn record_with(&self, train: bool, mut chain: Chain) -> Result<Chain> {
        self.embed(&mut chain)?;
        for l in 0..self.c.n_layer {
            self.layer_forward(&mut chain, l, true, train)?;
        }
        self.head(&mut chain, train)?;
        if train {
            for l in (0..self.c.n_layer).rev() {
                if l + 1 < self.c.n_layer {
                    // the last layer's activations are still in the scratch from the forward
                    self.layer_forward(&mut chain, l, false, true)?;
                }
                self.layer_backward(&mut chain, l)?;
            }
        }
        chain.finish()?;
        Ok(chain)
    }
}

impl crate::backend::Backend for Trainer {
    fn layout(&self) -> &LoraLayout {
        Trainer::layout(self)
    }
    fn set_params(&mut self, p: &[f32]) -> Result<()> {
        Trainer::set_params(self, p)
    }
    fn params(&self) -> Result<Vec<f32>> {
        Trainer::params(self)
    }
    fn grads(&self) -> Result<Vec<f32>> {
        Trainer::grads(self)
    }
    fn moments(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        Trainer::moments(self)
    }
    fn set_moments(&mut self, m: &[f32], v: &[f32]) -> Result<()> {
        Trainer::set_moments(self, m, v)
    }
    fn submit_micro(&mut self, r: &Rows, seed: u32) -> Result<()> {
        Trainer::submit_micro(self, r, seed)
    }
    fn finish_micro(&mut self) -> Result<f64> {
        Trainer::finish_micro(self)
    }
    fn eval(&mut self, r: &Rows) -> Result<f64> {
        Trainer::eval(self, r)
    }
    fn optimizer_step(&mut self, step: &AdamWStep) -> Result<f32> {
        Trainer::optimizer_step(self, step)
    }
    fn memory_bytes(&self) -> u64 {
        self.device_bytes()
    }
}
