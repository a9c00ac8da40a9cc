//! Recording helpers over the kernels: frozen projections (forward through `Linear`, input
//! gradient through `LinearT`, every piece of a split matrix), the LoRA products, and the
//! attention products of a training batch, all as strided GEMMs.

use octoflow_kernels::{GemmArgs, LinearArgs, LinearTArgs, QWeightRef, Strides, SumTarget};
use octoflow_model::gpu::weights::GpuMatrix;
use octoflow_vk::{BufferSlice, Chain};

use super::member::Member;
use super::{Trainer, TARGET_SLOTS};
use crate::error::Result;
use crate::lora::{LoraEntry, Target};

/// A plain row-major operand `[rows, cols]` read as is (`row = cols`, `col = 1`).
pub(crate) fn rm(cols: usize) -> Strides {
    Strides {
        row: cols as u32,
        col: 1,
        batch: [0, 0],
        group: 0,
    }
}

/// The transpose of a row-major `[rows, cols]` operand.
pub(crate) fn tr(cols: usize) -> Strides {
    Strides {
        row: 1,
        col: cols as u32,
        batch: [0, 0],
        group: 0,
    }
}

/// Output tiles (64 × 64) below which a product is split along k.
const SPLIT_TILES: usize = 64;
/// Fewest k per piece of a split product.
const SPLIT_MIN_K: usize = 128;
/// Most pieces of a split product.
const SPLIT_MAX: usize = 16;

/// Pieces to split an `[m, k] × [k, n]` product into along k (1: not split): enough for about
/// [`SPLIT_TILES`] workgroups, each piece at least [`SPLIT_MIN_K`] long, `k` divisible by the
/// count, the partial sums within `part_floats`.
pub(crate) fn split_k(m: usize, n: usize, k: usize, part_floats: usize) -> usize {
    let tiles = m.div_ceil(64) * n.div_ceil(64);
    let mut s = 1;
    while s * 2 <= SPLIT_MAX
        && tiles * s < SPLIT_TILES
        && k % (s * 2) == 0
        && k / (s * 2) >= SPLIT_MIN_K
        && s * 2 * m * n <= part_floats
    {
        s *= 2;
    }
    s
}

/// Where in a flat f32 buffer an adapter's A or B starts.
fn at(buf: &BufferSlice, offset: usize, n: usize) -> Result<BufferSlice> {
    Ok(buf
        .buffer
        .slice(buf.offset + 4 * offset as u64, 4 * n as u64)?)
}

/// The salt of `target`'s dropout mask in `layer` (distinct per adapter).
pub(crate) fn salt(e: &LoraEntry) -> u32 {
    (e.layer * TARGET_SLOTS + e.target as usize) as u32
}

/// One product of [`Trainer::mm_many`]: `C = alpha · op(A) · op(B) + beta · C` of
/// `[m, k] × [k, n]` (`beta` 0 or 1 where it may be split), with the scratch its split pieces
/// may use.
pub(crate) struct Mm {
    pub a: (BufferSlice, Strides),
    pub b: (BufferSlice, Strides),
    pub c: (BufferSlice, usize),
    pub mnk: [usize; 3],
    pub alpha: f32,
    pub beta: f32,
    pub part: BufferSlice,
}

impl Trainer {
    /// Records independent products side by side (distinct outputs, one barrier phase). A
    /// product with few output tiles and a long sum (the adapters' `x Aᵀ`, `dy B` and their
    /// gradients `dyᵀ h`, `dhᵀ x`: one side is the rank, the sum runs over the batch's rows)
    /// is split along k into pieces computed side by side (the batch index of the GEMM) in its
    /// own scratch and summed into C by a second pass, so it fills the GPU.
    pub(crate) fn mm_many(&self, chain: &mut Chain, jobs: &[Mm]) -> Result<()> {
        // per job: the pieces it is split into and their scratch (None: not split)
        let mut pieces = Vec::with_capacity(jobs.len());
        for j in jobs {
            let [m, n, k] = j.mnk;
            let split = if j.beta == 0.0 || j.beta == 1.0 {
                split_k(m, n, k, (j.part.size / 4) as usize)
            } else {
                1
            };
            pieces.push(if split > 1 {
                let bytes = 4 * (split * m * n) as u64;
                Some((split, j.part.buffer.slice(j.part.offset, bytes)?))
            } else {
                None
            });
        }
        let any_split = pieces.iter().any(Option::is_some);
        if any_split {
            // an earlier split product's sum may still be reading the pieces
            chain.compute_barrier()?;
        }
        for (j, p) in jobs.iter().zip(&pieces) {
            let [m, n, k] = j.mnk;
            let (c, c_row, c_batch, beta, split) = match p {
                Some((split, part)) => (part, n, [(m * n) as u32, 0], 0.0, *split),
                None => (&j.c.0, j.c.1, [0, 0], j.beta, 1),
            };
            let ks = (k / split) as u32;
            // piece i sums k from i·ks: the GEMM's batch index steps A's columns and B's rows
            let step = |s: Strides, stride: u32| Strides {
                batch: [if split > 1 { ks * stride } else { 0 }, 0],
                ..s
            };
            self.tk.gemm.record(
                chain,
                &GemmArgs {
                    a: &j.a.0,
                    a_s: step(j.a.1, j.a.1.col),
                    b: &j.b.0,
                    b_s: step(j.b.1, j.b.1.row),
                    b_div: 1,
                    c,
                    c_row: c_row as u32,
                    c_batch,
                    m: m as u32,
                    n: n as u32,
                    k: ks,
                    groups: 1,
                    batch: [split as u32, 1],
                    alpha: j.alpha,
                    beta,
                },
            )?;
        }
        if !any_split {
            return Ok(());
        }
        chain.compute_barrier()?;
        for (j, p) in jobs.iter().zip(&pieces) {
            let Some((split, part)) = p else { continue };
            let [m, n, _] = j.mnk;
            let target = SumTarget {
                n_rows: n as u32,
                n_tokens: m as u32,
                y_stride: j.c.1 as u32,
                y_col: 0,
                bias: false,
                accumulate: j.beta == 1.0,
            };
            self.tk
                .split_sum
                .record(chain, part, *split as u32, &j.c.0, part, &target)?;
        }
        Ok(())
    }

    /// `y = W x (+ bias)` over the batch's `T` rows: x `[T, n_cols]`, y `[T, n_rows]`, every piece.
    pub(crate) fn linear(
        &self,
        chain: &mut Chain,
        m: &GpuMatrix,
        x: &BufferSlice,
        y: &BufferSlice,
        rows: u32,
        bias: Option<&BufferSlice>,
    ) -> Result<()> {
        self.product(chain, m, x, y, rows, bias, false)
    }

    /// [`Trainer::linear`], adding into `y` with `accumulate`.
    #[allow(clippy::too_many_arguments)]
    fn product(
        &self,
        chain: &mut Chain,
        m: &GpuMatrix,
        x: &BufferSlice,
        y: &BufferSlice,
        rows: u32,
        bias: Option<&BufferSlice>,
        accumulate: bool,
    ) -> Result<()> {
        for p in &m.pieces {
            self.gm.kernels().linear.record(
                chain,
                &LinearArgs {
                    w: QWeightRef {
                        ty: m.ty,
                        data: &p.slice,
                        n_rows: p.n_rows,
                        n_cols: m.n_cols,
                    },
                    x,
                    y,
                    n_tokens: rows,
                    y_stride: m.n_rows,
                    y_col: p.row_begin,
                    bias,
                    accumulate,
                    norm: None,
                    pending: None,
                },
            )?;
        }
        Ok(())
    }

    /// `dx (+)= dy · W` (the input gradient of `y = W x`): dy `[T, n_rows]`, dx `[T, n_cols]`.
    /// Pieces after the first always accumulate (so they must be ordered after it: they are,
    /// within one dispatch order, because the kernel never reads other pieces' output rows).
    pub(crate) fn linear_t(
        &self,
        chain: &mut Chain,
        m: &GpuMatrix,
        dy: &BufferSlice,
        dx: &BufferSlice,
        rows: u32,
        accumulate: bool,
    ) -> Result<()> {
        if let Some(mt) = self.transposed.as_ref().and_then(|t| t.get(&m.name)) {
            // dx = dy · (Wᵀ)ᵀ: the forward product over the copy; its pieces split dx's columns
            return self.product(chain, mt, dy, dx, rows, None, accumulate);
        }
        for (i, p) in m.pieces.iter().enumerate() {
            if i > 0 {
                chain.compute_barrier()?;
            }
            self.tk.linear_t.record(
                chain,
                &LinearTArgs {
                    w: QWeightRef {
                        ty: m.ty,
                        data: &p.slice,
                        n_rows: p.n_rows,
                        n_cols: m.n_cols,
                    },
                    dy,
                    dy_stride: m.n_rows,
                    dy_col: p.row_begin,
                    dx,
                    n_tokens: rows,
                    accumulate: accumulate || i > 0,
                },
            )?;
        }
        Ok(())
    }

    /// The members with an adapter on `target` of `layer`, with its entry.
    fn adapted(&self, layer: usize, target: Target) -> Vec<(&Member, LoraEntry)> {
        self.members
            .iter()
            .filter_map(|m| m.layout.get(layer, target).map(|e| (m, *e)))
            .collect()
    }

    /// `out = dropout(x)` over member `m`'s rows of adapter `e`'s input side (`out` may be
    /// `x`): the member's seed word and the adapter's salt, so the forward and the backward
    /// draw the same mask.
    fn member_dropout(
        &self,
        chain: &mut Chain,
        m: &Member,
        e: &LoraEntry,
        x: &BufferSlice,
        out: &BufferSlice,
    ) -> Result<()> {
        self.tk.dropout.record(
            chain,
            x,
            out,
            (m.rows * e.n_in) as u32,
            m.dropout,
            &self.b.io.whole(),
            (self.io.seed + m.index) as u32,
            salt(e),
        )?;
        Ok(())
    }

    /// Each adapter's input, a member's rows of `x`, or while training (`train`) those rows
    /// through dropout into the member's rows of the `xd` scratch (same mask in the forward
    /// and the backward: the member's seed word and the salt are the same).
    fn lora_inputs(
        &self,
        chain: &mut Chain,
        ms: &[(&Member, LoraEntry)],
        x: &BufferSlice,
        train: bool,
    ) -> Result<Vec<BufferSlice>> {
        let mut out = Vec::with_capacity(ms.len());
        let mut masked = false;
        for (m, e) in ms {
            let xs = m.rows_of(x, e.n_in)?;
            if m.dropout == 0.0 || !train {
                out.push(xs);
                continue;
            }
            if !masked {
                // the scratch may still be read by the previous adapter's products
                chain.compute_barrier()?;
                masked = true;
            }
            let xd = m.rows_of(&self.b.xd.whole(), e.n_in)?;
            self.member_dropout(chain, m, e, &xs, &xd)?;
            out.push(xd);
        }
        if masked {
            chain.compute_barrier()?;
        }
        Ok(out)
    }

    /// `h = x Aᵀ` (kept for the backward) and `y += scale · h Bᵀ` for every member's adapter
    /// on `target` of `layer`, each over its rows. x `[T, n_in]`, y `[T, n_out]`; `train`: x
    /// through dropout.
    pub(crate) fn lora_forward(
        &self,
        chain: &mut Chain,
        layer: usize,
        target: Target,
        x: &BufferSlice,
        y: &BufferSlice,
        train: bool,
    ) -> Result<()> {
        let ms = self.adapted(layer, target);
        if ms.is_empty() {
            return Ok(());
        }
        let xin = self.lora_inputs(chain, &ms, x, train)?;
        let (mut shrink, mut expand) = (Vec::new(), Vec::new());
        for ((m, e), xin) in ms.iter().zip(xin) {
            let (t, r) = (m.rows, m.layout.rank);
            let p = m.params.whole();
            let h = m.h_slot(&self.b.h, target)?;
            let part = m.part(&self.b.part)?;
            shrink.push(Mm {
                a: (xin, rm(e.n_in)),
                b: (at(&p, e.a, r * e.n_in)?, tr(e.n_in)),
                c: (h.clone(), r),
                mnk: [t, r, e.n_in],
                alpha: 1.0,
                beta: 0.0,
                part: part.clone(),
            });
            expand.push(Mm {
                a: (h, rm(r)),
                b: (at(&p, e.b, e.n_out * r)?, tr(r)),
                c: (m.rows_of(y, e.n_out)?, e.n_out),
                mnk: [t, e.n_out, r],
                alpha: m.layout.scale,
                beta: 1.0,
                part,
            });
        }
        self.mm_many(chain, &shrink)?;
        chain.compute_barrier()?;
        self.mm_many(chain, &expand)
    }

    /// The adapters' backward given `dy = ∂L/∂y` `[T, n_out]`: accumulates each member's
    /// ∂L/∂A and ∂L/∂B into its gradients and adds its share of ∂L/∂x into its rows of `dx`
    /// `[T, n_in]`. `x` is the projection's input (as in the forward); `h` is still in its
    /// slots from the forward.
    pub(crate) fn lora_backward(
        &self,
        chain: &mut Chain,
        layer: usize,
        target: Target,
        x: &BufferSlice,
        dy: &BufferSlice,
        dx: &BufferSlice,
    ) -> Result<()> {
        let ms = self.adapted(layer, target);
        if ms.is_empty() {
            return Ok(());
        }
        struct Side {
            a: BufferSlice,
            ga: BufferSlice,
            dh: BufferSlice,
            dx: BufferSlice,
            part: BufferSlice,
        }
        let mut sides = Vec::with_capacity(ms.len());
        let (mut db, mut dhs) = (Vec::new(), Vec::new());
        for (m, e) in &ms {
            let (t, r, s) = (m.rows, m.layout.rank, m.layout.scale);
            let (p, g) = (m.params.whole(), m.grads.whole());
            let (a, b) = (at(&p, e.a, r * e.n_in)?, at(&p, e.b, e.n_out * r)?);
            let (ga, gb) = (at(&g, e.a, r * e.n_in)?, at(&g, e.b, e.n_out * r)?);
            let h = m.h_slot(&self.b.h, target)?;
            let dh = m.dh(&self.b.dh)?;
            let dy = m.rows_of(dy, e.n_out)?;
            let part = m.part(&self.b.part)?;
            // dB += s · dyᵀ h ; dh = s · dy B
            db.push(Mm {
                a: (dy.clone(), tr(e.n_out)),
                b: (h, rm(r)),
                c: (gb, r),
                mnk: [e.n_out, r, t],
                alpha: s,
                beta: 1.0,
                part: part.clone(),
            });
            dhs.push(Mm {
                a: (dy, rm(e.n_out)),
                b: (b, rm(r)),
                c: (dh.clone(), r),
                mnk: [t, r, e.n_out],
                alpha: s,
                beta: 0.0,
                part: part.clone(),
            });
            let dx = m.rows_of(dx, e.n_in)?;
            sides.push(Side {
                a,
                ga,
                dh,
                dx,
                part,
            });
        }
        self.mm_many(chain, &db)?;
        self.mm_many(chain, &dhs)?;
        let xin = self.lora_inputs(chain, &ms, x, true)?;
        chain.compute_barrier()?;
        // dA += dhᵀ x_in ; without dropout, dx += dh A
        let mut da = Vec::with_capacity(ms.len());
        let (mut plain, mut masked_dh_a) = (Vec::new(), Vec::new());
        let mut masked = Vec::new();
        for (((m, e), xin), sd) in ms.iter().zip(xin).zip(&sides) {
            let (t, r) = (m.rows, m.layout.rank);
            da.push(Mm {
                a: (sd.dh.clone(), tr(r)),
                b: (xin, rm(e.n_in)),
                c: (sd.ga.clone(), e.n_in),
                mnk: [r, e.n_in, t],
                alpha: 1.0,
                beta: 1.0,
                part: sd.part.clone(),
            });
            let dh_a = |c: BufferSlice, beta: f32| Mm {
                a: (sd.dh.clone(), rm(r)),
                b: (sd.a.clone(), rm(e.n_in)),
                c: (c, e.n_in),
                mnk: [t, e.n_in, r],
                alpha: 1.0,
                beta,
                part: sd.part.clone(),
            };
            if m.dropout == 0.0 {
                plain.push(dh_a(sd.dx.clone(), 1.0));
            } else {
                let tmp = m.rows_of(&self.b.xd.whole(), e.n_in)?;
                masked_dh_a.push(dh_a(tmp.clone(), 0.0));
                masked.push((*m, *e, tmp, sd.dx.clone()));
            }
        }
        self.mm_many(chain, &da)?;
        self.mm_many(chain, &plain)?;
        if masked.is_empty() {
            return Ok(());
        }
        // dx += dropout_mask(dh A) for the members with dropout: the mask's derivative, same
        // seed and salt; dh A lands in the xd scratch once dA has read the inputs there
        chain.compute_barrier()?;
        self.mm_many(chain, &masked_dh_a)?;
        chain.compute_barrier()?;
        for (m, e, tmp, _) in &masked {
            self.member_dropout(chain, m, e, tmp, tmp)?;
        }
        chain.compute_barrier()?;
        for (m, e, tmp, dx) in &masked {
            let n = (m.rows * e.n_in) as u32;
            self.gm.kernels().add.record(chain, dx, tmp, dx, n)?;
        }
        Ok(())
    }
}
