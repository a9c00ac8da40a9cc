//! One fine-tune inside a trainer: its adapters, gradients and AdamW moments, its rows of the
//! micro-batch, and its pieces of the scratch the adapters' products use.
//!
//! A trainer runs one or several members over one copy of the base ([`super::Trainer::joint`]).
//! Their rows are stacked into one batch (member after member), so every frozen product, norm,
//! the attention and the loss head run once over all of them; only the adapters' products are
//! per member, recorded side by side in the same barrier phases, each over its own rows. A
//! member shorter than the longest (`seq_len`) has its sequences padded at their end with rows
//! that carry no loss: attention is causal, so the padding changes none of its rows. Members
//! share no trainable state, so a member's gradients are the ones it gets alone — except that
//! a padded member with dropout and several sequences draws its masks at other element indices
//! than alone (a different draw from the same distribution).

use octoflow_kernels::IGNORE;
use octoflow_vk::{Buffer, BufferSlice, Context, MemoryKind};

use super::{Rows, TrainerOptions};
use crate::error::{Result, TrainError};
use crate::lora::{LoraLayout, Target};

/// A member of a trainer (see the module doc).
pub(crate) struct Member {
    /// Index among the trainer's members (its dropout seed is the io buffer's `seed + index`).
    pub index: usize,
    pub layout: LoraLayout,
    pub dropout: f32,
    /// Sequences per micro-batch.
    pub batch: usize,
    /// Rows per sequence the member's own micro-batches have (≤ the trainer's).
    pub seq_len: usize,
    /// The member's first row in the stacked batch, and its rows there (`batch × the
    /// trainer's seq_len`).
    pub row0: usize,
    pub rows: usize,
    pub params: Buffer,
    pub grads: Buffer,
    pub m: Buffer,
    pub v2: Buffer,
    /// `[0]`: the sum of squared gradients of the last optimizer step.
    pub stats: Buffer,
    /// Float offsets of the member's pieces of the shared scratch: `h` (one `[rows, rank]`
    /// slot per target), `dh` (`[rows, rank]`) and the split products' partial sums.
    pub h0: usize,
    pub dh0: usize,
    pub part0: usize,
    pub part_floats: usize,
}

/// Floats every scratch piece starts at a multiple of: 256 bytes, more than any device's
/// storage-buffer offset alignment.
const SLOT_ALIGN: usize = 64;

/// `n` floats rounded up to whole [`SLOT_ALIGN`]s.
fn slot(n: usize) -> usize {
    n.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
}

/// Where each member's scratch starts, and the scratch's total floats.
pub(crate) struct Scratch {
    pub h: usize,
    pub dh: usize,
    pub part: usize,
}

impl Member {
    /// Allocates member `index`'s trainable state for `opts` (rows from `row0`, sequences of
    /// `seq_len` rows in the stacked batch); `at` is where its scratch pieces start and moves
    /// past them. `max_side` is the widest side of any adapted projection.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: &Context,
        index: usize,
        opts: &TrainerOptions,
        layout: LoraLayout,
        row0: usize,
        seq_len: usize,
        max_side: usize,
        at: &mut Scratch,
    ) -> Result<Self> {
        let rows = opts.batch * seq_len;
        let r = layout.rank;
        let n = layout.n_params;
        let buf = |what: &str| -> Result<Buffer> {
            Ok(Buffer::new(
                ctx,
                &format!("train.{index}.{what}"),
                4 * n.max(4) as u64,
                MemoryKind::DeviceLocal,
            )?)
        };
        let member = Member {
            index,
            dropout: opts.lora.dropout,
            batch: opts.batch,
            seq_len: opts.seq_len,
            row0,
            rows,
            params: buf("params")?,
            grads: buf("grads")?,
            m: buf("adam_m")?,
            v2: buf("adam_v")?,
            stats: Buffer::new(
                ctx,
                &format!("train.{index}.stats"),
                16,
                MemoryKind::Readback,
            )?,
            h0: at.h,
            dh0: at.dh,
            part0: at.part,
            part_floats: 16 * r * max_side,
            layout,
        };
        at.h += Target::ALL.len() * slot(rows * r);
        at.dh += slot(rows * r);
        at.part += slot(member.part_floats);
        for b in [&member.grads, &member.m, &member.v2] {
            ctx.fill(b, 0, 4 * n as u64, 0)?;
        }
        Ok(member)
    }

    /// The member's rows of `x`, a `[T, width]` activation of the stacked batch.
    pub fn rows_of(&self, x: &BufferSlice, width: usize) -> Result<BufferSlice> {
        let row = 4 * width as u64;
        Ok(x.buffer
            .slice(x.offset + self.row0 as u64 * row, self.rows as u64 * row)?)
    }

    /// The slot holding `h = x Aᵀ` `[rows, rank]` of `target`.
    pub fn h_slot(&self, h: &Buffer, target: Target) -> Result<BufferSlice> {
        let n = self.rows * self.layout.rank;
        let at = self.h0 + slot(n) * target as usize;
        Ok(h.slice(4 * at as u64, 4 * n as u64)?)
    }

    /// The member's `dh` `[rows, rank]`.
    pub fn dh(&self, dh: &Buffer) -> Result<BufferSlice> {
        let n = self.rows * self.layout.rank;
        Ok(dh.slice(4 * self.dh0 as u64, 4 * n as u64)?)
    }

    /// The member's partial-sum scratch.
    pub fn part(&self, part: &Buffer) -> Result<BufferSlice> {
        Ok(part.slice(4 * self.part0 as u64, 4 * self.part_floats as u64)?)
    }

    /// `r` (a micro-batch of the member's own shape) as rows of the stacked batch: every
    /// sequence padded to `seq_len` rows that carry no loss.
    pub fn place(&self, r: &Rows, seq_len: usize, n_vocab: usize) -> Result<Rows> {
        r.check(self.batch * self.seq_len, n_vocab)?;
        if seq_len == self.seq_len {
            return Ok(r.clone());
        }
        let mut out = Rows::default();
        let pad = seq_len - self.seq_len;
        for s in 0..self.batch {
            let span = s * self.seq_len..(s + 1) * self.seq_len;
            out.ids.extend_from_slice(&r.ids[span.clone()]);
            out.labels.extend_from_slice(&r.labels[span.clone()]);
            out.weights.extend_from_slice(&r.weights[span.clone()]);
            out.pos.extend_from_slice(&r.pos[span]);
            let n = out.ids.len() + pad;
            out.ids.resize(n, 0);
            out.labels.resize(n, IGNORE);
            out.weights.resize(n, 0.0);
            // each padding row a document of its own
            out.pos.resize(n, 0);
        }
        Ok(out)
    }

    /// Rows that compute nothing anyone reads: the member's share of a step it sits out.
    pub fn idle(&self) -> Rows {
        Rows {
            ids: vec![0; self.rows],
            labels: vec![IGNORE; self.rows],
            weights: vec![0.0; self.rows],
            pos: vec![0; self.rows],
        }
    }
}

/// Checks what a joint trainer needs of its members' options.
pub(crate) fn check_members(members: &[TrainerOptions]) -> Result<()> {
    if members.is_empty() {
        return Err(TrainError::Config(
            "a trainer needs at least one fine-tune".into(),
        ));
    }
    for o in members {
        o.lora.validate()?;
        if o.batch == 0 || o.seq_len < 2 {
            return Err(TrainError::Config(format!(
                "batch {} × seq-len {}: need at least one sequence of two tokens",
                o.batch, o.seq_len
            )));
        }
    }
    Ok(())
}
