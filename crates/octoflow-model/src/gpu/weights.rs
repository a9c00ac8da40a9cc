//! The model's weights on the device: every tensor uploaded once, in its file encoding, into as
//! few buffers as the device allows (`octoflow_vk::pack_plan`).
//!
//! A matrix larger than one binding (gemma3's 262144-row embedding table is 178 MB; lavapipe
//! binds at most 128 MiB) is split by rows into pieces, each bound on its own; the kernels take
//! the piece's first row (`y_col` of `Linear`, `row_begin` of `GetRows`) so the split is
//! invisible to the math. A mixture of experts' stacked tensors (GGUF's 3-D `*_exps`) are split
//! the same way but by whole experts ([`GpuExperts`]): the expert kernels take a piece's first
//! expert and skip pairs routed to another piece.

use octoflow_gguf::GgmlType;
use octoflow_kernels::RopeFreqs;
use octoflow_vk::{pack_plan, Buffer, BufferSlice, Context, MemoryKind};

use crate::error::{ModelError, Result};
use crate::model::Model;
use crate::ops::rope_freqs;
use crate::plan::RopePlan;
use crate::weights::{FfnWeights, QMatrix};

/// Every tensor starts on a 16-byte boundary and its binding covers whole 16-byte words, so
/// shaders may read 32-bit words past a tensor's last (2-byte aligned) block without leaving it.
const PAD: u64 = 16;

/// Rows `row_begin .. row_begin + n_rows` of a matrix, bound as one slice.
#[derive(Clone)]
pub struct Piece {
    pub slice: BufferSlice,
    pub row_begin: u32,
    pub n_rows: u32,
}

/// A weight matrix on the device: `n_rows` rows of `n_cols` elements in GGUF encoding `ty`.
#[derive(Clone)]
pub struct GpuMatrix {
    pub name: String,
    pub ty: GgmlType,
    pub n_rows: u32,
    pub n_cols: u32,
    pub pieces: Vec<Piece>,
}

/// One transformer block's tensors on the device (see [`crate::BlockWeights`]).
pub struct GpuBlock {
    pub attn_norm: BufferSlice,
    pub attn_q: GpuMatrix,
    pub attn_k: GpuMatrix,
    pub attn_v: GpuMatrix,
    pub attn_q_bias: Option<BufferSlice>,
    pub attn_k_bias: Option<BufferSlice>,
    pub attn_v_bias: Option<BufferSlice>,
    pub attn_q_norm: Option<BufferSlice>,
    pub attn_k_norm: Option<BufferSlice>,
    pub attn_output: GpuMatrix,
    pub attn_output_bias: Option<BufferSlice>,
    pub attn_sinks: Option<BufferSlice>,
    pub post_attention_norm: Option<BufferSlice>,
    pub ffn_norm: BufferSlice,
    pub ffn: GpuFfn,
    pub post_ffw_norm: Option<BufferSlice>,
    /// The layer's RoPE angles: its plan's base, scale and YaRN terms with `rope_freqs` folded
    /// into one frequency per rotated pair ([`crate::ops::rope_freqs`]); one table per distinct
    /// plan, shared by its layers. With LongRoPE factors, the short factors' table here and the
    /// long factors' in `rope_long` ([`GpuBlock::rope_for`] picks by the run's context).
    pub rope: RopeFreqs,
    pub rope_long: Option<RopeFreqs>,
    /// The context past which `rope_long` applies.
    pub n_ctx_orig: usize,
}

impl GpuBlock {
    /// The RoPE table of a run with an `n_ctx`-position context (llama.cpp's choice).
    pub fn rope_for(&self, n_ctx: usize) -> &RopeFreqs {
        match &self.rope_long {
            Some(long) if n_ctx > self.n_ctx_orig => long,
            _ => &self.rope,
        }
    }
}

/// A block's feed-forward matrices on the device, as the plan's kind.
pub enum GpuFfn {
    Glu(GpuGlu),
    Moe(GpuMoe),
}

/// A gated feed-forward (see [`crate::weights::GluWeights`]).
pub struct GpuGlu {
    pub ffn_gate: GpuMatrix,
    pub ffn_up: GpuMatrix,
    pub ffn_down: GpuMatrix,
}

/// A mixture of experts (see [`crate::weights::MoeWeights`]): the router, its bias, and every
/// expert's gate, up and down matrices with their biases (`[n_expert * rows]` f32 each).
pub struct GpuMoe {
    pub router: GpuMatrix,
    pub router_bias: Option<BufferSlice>,
    pub gate: GpuExperts,
    pub up: GpuExperts,
    pub down: GpuExperts,
    pub gate_bias: Option<BufferSlice>,
    pub up_bias: Option<BufferSlice>,
    pub down_bias: Option<BufferSlice>,
}

/// Experts `e_begin .. e_begin + n_experts` of a stacked tensor, bound as one slice.
#[derive(Clone)]
pub struct ExpertPiece {
    pub slice: BufferSlice,
    pub e_begin: u32,
    pub n_experts: u32,
}

/// A stacked expert tensor on the device: `n_expert` matrices of `n_rows` rows of `n_cols`
/// elements in GGUF encoding `ty`, in pieces of whole experts.
#[derive(Clone)]
pub struct GpuExperts {
    pub name: String,
    pub ty: GgmlType,
    pub n_expert: u32,
    pub n_rows: u32,
    pub n_cols: u32,
    pub pieces: Vec<ExpertPiece>,
}

impl GpuBlock {
    /// The gated feed-forward's matrices, for paths that run only that kind (training).
    pub fn glu(&self) -> Result<&GpuGlu> {
        match &self.ffn {
            GpuFfn::Glu(g) => Ok(g),
            GpuFfn::Moe(_) => Err(ModelError::Unsupported(
                "this path does not run a mixture-of-experts feed-forward yet".into(),
            )),
        }
    }
}

/// All weights on the device, and the buffers that hold them.
pub struct GpuWeights {
    pub token_embd: GpuMatrix,
    pub output_norm: BufferSlice,
    pub output: GpuMatrix,
    pub blk: Vec<GpuBlock>,
    /// Bytes of device memory the weights occupy.
    pub bytes: u64,
}

/// Collects every tensor's bytes, then places and uploads them in one go.
pub(crate) struct Uploader<'a> {
    arrays: Vec<&'a [u8]>,
    limit: u64,
}

/// Where an array went: index into the uploader's list.
#[derive(Clone, Copy)]
pub(crate) struct Slot(pub usize);

/// A matrix as planned: its pieces' slots.
struct PlannedMatrix<'a> {
    m: &'a QMatrix,
    pieces: Vec<(Slot, u32, u32)>,
}

/// A stacked expert tensor as planned: its pieces' slots, first experts and expert counts.
struct PlannedExperts<'a> {
    m: &'a QMatrix,
    n_expert: u32,
    pieces: Vec<(Slot, u32, u32)>,
}

impl PlannedExperts<'_> {
    fn bind(&self, slices: &[BufferSlice]) -> GpuExperts {
        GpuExperts {
            name: self.m.name.clone(),
            ty: self.m.ty,
            n_expert: self.n_expert,
            n_rows: (self.m.n_rows / self.n_expert as usize) as u32,
            n_cols: self.m.n_cols as u32,
            pieces: self
                .pieces
                .iter()
                .map(|&(slot, e_begin, n_experts)| ExpertPiece {
                    slice: slices[slot.0].clone(),
                    e_begin,
                    n_experts,
                })
                .collect(),
        }
    }
}

/// A block's feed-forward as planned.
enum PlannedFfn<'a> {
    Glu([PlannedMatrix<'a>; 3]),
    Moe {
        router: PlannedMatrix<'a>,
        experts: [PlannedExperts<'a>; 3],
        /// router, gate, up, down biases
        biases: [Option<Slot>; 4],
    },
}

impl<'a> Uploader<'a> {
    /// An empty upload for `ctx`'s device.
    pub(crate) fn new(ctx: &Context) -> Self {
        Uploader {
            arrays: Vec::new(),
            limit: ctx.caps().max_buffer_bytes(),
        }
    }

    pub(crate) fn add(&mut self, bytes: &'a [u8]) -> Slot {
        self.arrays.push(bytes);
        Slot(self.arrays.len() - 1)
    }

    pub(crate) fn vector(&mut self, v: &'a [f32]) -> Slot {
        self.add(octoflow_vk::as_bytes(v))
    }

    /// Refuses a matrix of a type the kernels do not read, naming it.
    fn check_type(&self, m: &QMatrix) -> Result<()> {
        // Every matrix goes through the same per-type kernels (products, the GLU, get_rows for
        // the embedding, linear_t when training, the expert products), so one check here names
        // the tensor before any recording would fail on it.
        if !octoflow_kernels::Linear::supports(m.ty) {
            let supported: Vec<String> = octoflow_kernels::Linear::weight_types()
                .iter()
                .map(|t| t.to_string())
                .collect();
            return Err(ModelError::UnsupportedGpuTensorType {
                name: m.name.clone(),
                ty: m.ty,
                supported: supported.join(", "),
            });
        }
        Ok(())
    }

    fn matrix(&mut self, m: &'a QMatrix) -> Result<PlannedMatrix<'a>> {
        self.check_type(m)?;
        let row_bytes = m.row_bytes() as u64;
        let rows_per_piece = ((self.limit - PAD) / row_bytes.max(1)).min(u64::from(u32::MAX));
        if rows_per_piece == 0 {
            return Err(ModelError::Gpu(format!(
                "tensor {}: one row of {row_bytes} bytes exceeds the device's binding limit of {} bytes",
                m.name, self.limit
            )));
        }
        let mut pieces = Vec::new();
        let mut row = 0usize;
        while row < m.n_rows {
            let n = (m.n_rows - row).min(rows_per_piece as usize);
            let bytes = &m.data()[row * m.row_bytes()..(row + n) * m.row_bytes()];
            pieces.push((self.add(bytes), row as u32, n as u32));
            row += n;
        }
        Ok(PlannedMatrix { m, pieces })
    }

    /// A stacked tensor of `n_expert` experts (`m`'s rows, expert after expert), in pieces of
    /// whole experts that each fit one binding.
    fn experts(&mut self, m: &'a QMatrix, n_expert: usize) -> Result<PlannedExperts<'a>> {
        self.check_type(m)?;
        if n_expert == 0 || !m.n_rows.is_multiple_of(n_expert) {
            return Err(ModelError::Gpu(format!(
                "tensor {}: {} rows are not {n_expert} experts of equal size",
                m.name, m.n_rows
            )));
        }
        let expert_bytes = (m.n_rows / n_expert * m.row_bytes()) as u64;
        let per_piece = ((self.limit - PAD) / expert_bytes.max(1)).min(u64::from(u32::MAX));
        if per_piece == 0 {
            return Err(ModelError::Gpu(format!(
                "tensor {}: one expert of {expert_bytes} bytes exceeds the device's binding limit of {} bytes",
                m.name, self.limit
            )));
        }
        let rows = m.n_rows / n_expert;
        let mut pieces = Vec::new();
        let mut e = 0usize;
        while e < n_expert {
            let n = (n_expert - e).min(per_piece as usize);
            let bytes = &m.data()[e * rows * m.row_bytes()..(e + n) * rows * m.row_bytes()];
            pieces.push((self.add(bytes), e as u32, n as u32));
            e += n;
        }
        Ok(PlannedExperts {
            m,
            n_expert: n_expert as u32,
            pieces,
        })
    }

    /// Allocates the buffers, uploads every array and returns each array's binding.
    pub(crate) fn upload(self, ctx: &Context) -> Result<(Vec<BufferSlice>, u64)> {
        let sizes: Vec<u64> = self
            .arrays
            .iter()
            .map(|a| (a.len() as u64).div_ceil(PAD).max(1) * PAD)
            .collect();
        let align = ctx.caps().storage_offset_alignment.max(PAD);
        let (places, chunk_sizes) = pack_plan(&sizes, align, self.limit)?;
        let buffers = chunk_sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                Buffer::new(ctx, &format!("weights#{i}"), size, MemoryKind::DeviceLocal)
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut slices = Vec::with_capacity(self.arrays.len());
        for ((bytes, place), &size) in self.arrays.iter().zip(&places).zip(&sizes) {
            let buffer = &buffers[place.chunk];
            if !bytes.is_empty() {
                ctx.upload(buffer, place.offset, bytes)?;
            }
            slices.push(buffer.slice(place.offset, size)?);
        }
        Ok((slices, chunk_sizes.iter().sum()))
    }
}

impl PlannedMatrix<'_> {
    fn bind(&self, slices: &[BufferSlice]) -> GpuMatrix {
        GpuMatrix {
            name: self.m.name.clone(),
            ty: self.m.ty,
            n_rows: self.m.n_rows as u32,
            n_cols: self.m.n_cols as u32,
            pieces: self
                .pieces
                .iter()
                .map(|&(slot, row_begin, n_rows)| Piece {
                    slice: slices[slot.0].clone(),
                    row_begin,
                    n_rows,
                })
                .collect(),
        }
    }
}

impl GpuWeights {
    /// Uploads `model`'s weights to `ctx`'s device.
    pub fn upload(ctx: &Context, model: &Model) -> Result<Self> {
        Self::upload_within(ctx, model, ctx.caps().max_buffer_bytes())
    }

    /// [`GpuWeights::upload`] with bindings of at most `limit` bytes (tests split tiny
    /// models' tensors as large ones are split on devices with small bindings).
    pub(crate) fn upload_within(ctx: &Context, model: &Model, limit: u64) -> Result<Self> {
        let w = &model.weights;
        let mut up = Uploader::new(ctx);
        up.limit = up.limit.min(limit);
        let token_embd = up.matrix(&w.token_embd)?;
        let output = if w.output_is_tied {
            None
        } else {
            Some(up.matrix(&w.output)?)
        };
        let output_norm = up.vector(&w.output_norm);
        struct PlannedBlock<'a> {
            mats: Vec<PlannedMatrix<'a>>,
            ffn: PlannedFfn<'a>,
            attn_norm: Slot,
            ffn_norm: Slot,
            opt: Vec<Option<Slot>>,
        }
        let mut blocks = Vec::with_capacity(w.blk.len());
        for b in &w.blk {
            let mats = [&b.attn_q, &b.attn_k, &b.attn_v, &b.attn_output]
                .into_iter()
                .map(|m| up.matrix(m))
                .collect::<Result<Vec<_>>>()?;
            let ffn = match &b.ffn {
                FfnWeights::Glu(g) => PlannedFfn::Glu([
                    up.matrix(&g.ffn_gate)?,
                    up.matrix(&g.ffn_up)?,
                    up.matrix(&g.ffn_down)?,
                ]),
                FfnWeights::Moe(m) => {
                    let n_expert = m.router.n_rows;
                    PlannedFfn::Moe {
                        router: up.matrix(&m.router)?,
                        experts: [
                            up.experts(&m.gate, n_expert)?,
                            up.experts(&m.up, n_expert)?,
                            up.experts(&m.down, n_expert)?,
                        ],
                        biases: [&m.router_bias, &m.gate_bias, &m.up_bias, &m.down_bias]
                            .map(|v| v.as_deref().map(|v| up.vector(v))),
                    }
                }
            };
            let attn_norm = up.vector(&b.attn_norm);
            let ffn_norm = up.vector(&b.ffn_norm);
            let opt = [
                b.attn_q_bias.as_ref(),
                b.attn_k_bias.as_ref(),
                b.attn_v_bias.as_ref(),
                b.attn_q_norm.as_ref(),
                b.attn_k_norm.as_ref(),
                b.post_attention_norm.as_ref(),
                b.post_ffw_norm.as_ref(),
                b.attn_output_bias.as_ref(),
                b.attn_sinks.as_ref(),
            ]
            .into_iter()
            .map(|v| v.map(|v| up.vector(v)))
            .collect();
            blocks.push(PlannedBlock {
                mats,
                ffn,
                attn_norm,
                ffn_norm,
                opt,
            });
        }
        let (slices, bytes) = up.upload(ctx)?;
        let rope = rope_tables(ctx, model, 1)?;
        // LongRoPE: the tables for contexts past the original one, where they differ
        let rope_long =
            match model.weights.rope_freqs.is_none() && model.weights.rope_long.is_some() {
                true => Some(rope_tables(ctx, model, usize::MAX)?),
                false => None,
            };
        let s = |slot: Slot| slices[slot.0].clone();
        let token_embd_gpu = token_embd.bind(&slices);
        let blk = blocks
            .iter()
            .zip(rope)
            .enumerate()
            .map(|(il, (b, rope))| {
                let m = |i: usize| b.mats[i].bind(&slices);
                let v = |i: usize| b.opt[i].map(s);
                let ffn = match &b.ffn {
                    PlannedFfn::Glu([g, u, d]) => GpuFfn::Glu(GpuGlu {
                        ffn_gate: g.bind(&slices),
                        ffn_up: u.bind(&slices),
                        ffn_down: d.bind(&slices),
                    }),
                    PlannedFfn::Moe {
                        router,
                        experts: [g, u, d],
                        biases: [rb, gb, ub, db],
                    } => GpuFfn::Moe(GpuMoe {
                        router: router.bind(&slices),
                        router_bias: rb.map(s),
                        gate: g.bind(&slices),
                        up: u.bind(&slices),
                        down: d.bind(&slices),
                        gate_bias: gb.map(s),
                        up_bias: ub.map(s),
                        down_bias: db.map(s),
                    }),
                };
                GpuBlock {
                    attn_norm: s(b.attn_norm),
                    attn_q: m(0),
                    attn_k: m(1),
                    attn_v: m(2),
                    attn_q_bias: v(0),
                    attn_k_bias: v(1),
                    attn_v_bias: v(2),
                    attn_q_norm: v(3),
                    attn_k_norm: v(4),
                    attn_output: m(3),
                    attn_output_bias: v(7),
                    attn_sinks: v(8),
                    post_attention_norm: v(5),
                    ffn_norm: s(b.ffn_norm),
                    ffn,
                    post_ffw_norm: v(6),
                    rope,
                    rope_long: rope_long.as_ref().map(|t| t[il].clone()),
                    n_ctx_orig: model.config.n_ctx_orig,
                }
            })
            .collect();
        Ok(Self {
            output: output.map_or_else(|| token_embd_gpu.clone(), |o| o.bind(&slices)),
            token_embd: token_embd_gpu,
            output_norm: s(output_norm),
            blk,
            bytes,
        })
    }
}

/// Each layer's RoPE frequency table (see [`GpuBlock::rope`]) for runs of `n_ctx` positions,
/// uploaded once per distinct plan.
fn rope_tables(ctx: &Context, model: &Model, n_ctx: usize) -> Result<Vec<RopeFreqs>> {
    let c = &model.config;
    let ff = model.weights.rope_factors(n_ctx, c.n_ctx_orig);
    let mut made: Vec<(RopePlan, RopeFreqs)> = Vec::new();
    c.blocks
        .iter()
        .map(|b| {
            let r = b.attn.rope;
            if let Some((_, t)) = made.iter().find(|(p, _)| *p == r) {
                return Ok(t.clone());
            }
            let freqs = rope_freqs(c.n_rot, r.base, r.scale, ff, r.yarn.as_ref());
            let mscale = r.yarn.map_or(1.0, |y| y.mscale);
            let name = format!("rope_freqs#{}", made.len());
            let t = RopeFreqs::upload(ctx, &name, &freqs, mscale)?;
            made.push((r, t.clone()));
            Ok(t)
        })
        .collect()
}

#[cfg(test)]
#[path = "weights_tests.rs"]
mod tests;
