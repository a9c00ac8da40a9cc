//! Recording helpers over the kernels: frozen projections (forward through `Linear`, input
//! gradient through `LinearT`, every piece of a split matrix), the LoRA products, and the
//! attention products of a training batch, all as strided GEMMs.

use octoflow_kernels::{GemmArgs, LinearArgs, LinearTArgs, QWeightRef, Strides, SumTarget};
use octoflow_model::gpu::weights::GpuMatrix;
use octoflow_vk::{BufferSlice, Chain};

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

impl Trainer {
    /// `C = alpha · op(A) · op(B) + beta · C` for one (unbatched) product of `[m, k] × [k, n]`,
    /// `beta` 0 or 1. A product with few output tiles and a long sum (the adapters' `x Aᵀ`,
    /// `dy B` and their gradients `dyᵀ h`, `dhᵀ x`: one side is the rank, the sum runs over
    /// the batch's rows) is split along k into pieces computed side by side (the batch index of
    /// the GEMM) and summed into C by a second pass, so it fills the GPU.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mm(
        &self,
        chain: &mut Chain,
        a: (&BufferSlice, Strides),
        b: (&BufferSlice, Strides),
        c: (&BufferSlice, usize),
        [m, n, k]: [usize; 3],
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        let split = split_k(m, n, k, self.part_floats);
        if split > 1 && (beta == 0.0 || beta == 1.0) {
            let ks = k / split;
            let part = self.b.part.slice(0, 4 * (split * m * n) as u64)?;
            // the previous split product's sum may still be reading the pieces
            chain.compute_barrier()?;
            let batched = |s: Strides, step: u32| Strides {
                batch: [step, 0],
                ..s
            };
            self.tk.gemm.record(
                chain,
                &GemmArgs {
                    a: a.0,
                    a_s: batched(a.1, (ks as u32) * a.1.col),
                    b: b.0,
                    b_s: batched(b.1, (ks as u32) * b.1.row),
                    b_div: 1,
                    c: &part,
                    c_row: n as u32,
                    c_batch: [(m * n) as u32, 0],
                    m: m as u32,
                    n: n as u32,
                    k: ks as u32,
                    groups: 1,
                    batch: [split as u32, 1],
                    alpha,
                    beta: 0.0,
                },
            )?;
            chain.compute_barrier()?;
            let target = SumTarget {
                n_rows: n as u32,
                n_tokens: m as u32,
                y_stride: c.1 as u32,
                y_col: 0,
                bias: false,
                accumulate: beta == 1.0,
            };
            self.tk
                .split_sum
                .record(chain, &part, split as u32, c.0, &part, &target)?;
            return Ok(());
        }
        self.tk.gemm.record(
            chain,
            &GemmArgs {
                a: a.0,
                a_s: a.1,
                b: b.0,
                b_s: b.1,
                b_div: 1,
                c: c.0,
                c_row: c.1 as u32,
                c_batch: [0, 0],
                m: m as u32,
                n: n as u32,
                k: k as u32,
                groups: 1,
                batch: [1, 1],
                alpha,
                beta,
            },
        )?;
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

    /// The adapter's input: `x`, or while training (`train`) `dropout(x)` into the `xd`
    /// scratch (same mask in the forward and the backward: the seed word and the salt are the
    /// same).
    fn lora_input(
        &self,
        chain: &mut Chain,
        e: &LoraEntry,
        x: &BufferSlice,
        train: bool,
    ) -> Result<BufferSlice> {
        if self.dropout == 0.0 || !train {
            return Ok(x.clone());
        }
        let n = self.rows * e.n_in;
        let xd = self.b.xd.slice(0, 4 * n as u64)?;
        // the scratch may still be read by the previous adapter's products
        chain.compute_barrier()?;
        self.tk.dropout.record(
            chain,
            x,
            &xd,
            n as u32,
            self.dropout,
            &self.b.io.whole(),
            self.io.seed as u32,
            salt(e),
        )?;
        chain.compute_barrier()?;
        Ok(xd)
    }

    /// `h = x Aᵀ` (kept for the backward) and `y += scale · h Bᵀ` for the adapter on `target`
    /// of `layer`, if the run has one. x `[T, n_in]`, y `[T, n_out]`; `train`: x through
    /// dropout.
    pub(crate) fn lora_forward(
        &self,
        chain: &mut Chain,
        layer: usize,
        target: Target,
        x: &BufferSlice,
        y: &BufferSlice,
        train: bool,
    ) -> Result<()> {
        let Some(e) = self.layout.get(layer, target).copied() else {
            return Ok(());
        };
        let (t, r) = (self.rows, self.layout.rank);
        let p = self.b.params.whole();
        let xin = self.lora_input(chain, &e, x, train)?;
        let h = self.h_slot(target)?;
        let a = at(&p, e.a, r * e.n_in)?;
        let b = at(&p, e.b, e.n_out * r)?;
        self.mm(
            chain,
            (&xin, rm(e.n_in)),
            (&a, tr(e.n_in)),
            (&h, r),
            [t, r, e.n_in],
            1.0,
            0.0,
        )?;
        chain.compute_barrier()?;
        let s = self.layout.scale;
        self.mm(
            chain,
            (&h, rm(r)),
            (&b, tr(r)),
            (y, e.n_out),
            [t, e.n_out, r],
            s,
            1.0,
        )?;
        Ok(())
    }

    /// The adapter's backward given `dy = ∂L/∂y` `[T, n_out]`: accumulates ∂L/∂A and ∂L/∂B into
    /// the gradient buffer and adds its share of ∂L/∂x into `dx` `[T, n_in]`. `x` is the
    /// projection's input (as in the forward); `h` is still in its slot from the forward.
    pub(crate) fn lora_backward(
        &self,
        chain: &mut Chain,
        layer: usize,
        target: Target,
        x: &BufferSlice,
        dy: &BufferSlice,
        dx: &BufferSlice,
    ) -> Result<()> {
        let Some(e) = self.layout.get(layer, target).copied() else {
            return Ok(());
        };
        let (t, r, s) = (self.rows, self.layout.rank, self.layout.scale);
        let (p, g) = (self.b.params.whole(), self.b.grads.whole());
        let (a, b) = (at(&p, e.a, r * e.n_in)?, at(&p, e.b, e.n_out * r)?);
        let (ga, gb) = (at(&g, e.a, r * e.n_in)?, at(&g, e.b, e.n_out * r)?);
        let h = self.h_slot(target)?;
        let dh = self.b.dh.slice(0, 4 * (t * r) as u64)?;
        // dB += s · dyᵀ h ; dh = s · dy B
        self.mm(
            chain,
            (dy, tr(e.n_out)),
            (&h, rm(r)),
            (&gb, r),
            [e.n_out, r, t],
            s,
            1.0,
        )?;
        self.mm(
            chain,
            (dy, rm(e.n_out)),
            (&b, rm(r)),
            (&dh, r),
            [t, r, e.n_out],
            s,
            0.0,
        )?;
        let xin = self.lora_input(chain, &e, x, true)?;
        chain.compute_barrier()?;
        // dA += dhᵀ x_in
        self.mm(
            chain,
            (&dh, tr(r)),
            (&xin, rm(e.n_in)),
            (&ga, e.n_in),
            [r, e.n_in, t],
            1.0,
            1.0,
        )?;
        if self.dropout == 0.0 {
            // dx += dh A
            self.mm(
                chain,
                (&dh, rm(r)),
                (&a, rm(e.n_in)),
                (dx, e.n_in),
                [t, e.n_in, r],
                1.0,
                1.0,
            )?;
        } else {
            // dx += dropout_mask(dh A): the mask's derivative, same seed and salt
            let n = t * e.n_in;
            let tmp = self.b.xd.slice(0, 4 * n as u64)?;
            chain.compute_barrier()?;
            self.mm(
                chain,
                (&dh, rm(r)),
                (&a, rm(e.n_in)),
                (&tmp, e.n_in),
                [t, e.n_in, r],
                1.0,
                0.0,
            )?;
            chain.compute_barrier()?;
            self.tk.dropout.record(
                chain,
                &tmp,
                &tmp,
                n as u32,
                self.dropout,
                &self.b.io.whole(),
                self.io.seed as u32,
                salt(&e),
            )?;
            chain.compute_barrier()?;
            self.gm
                .kernels()
                .add
                .record(chain, dx, &tmp, dx, n as u32)?;
        }
        Ok(())
    }

    /// The scratch holding `h = x Aᵀ` `[T, rank]` of `target`.
    fn h_slot(&self, target: Target) -> Result<BufferSlice> {
        let n = (self.rows * self.layout.rank) as u64;
        Ok(self.b.h.slice(4 * n * target as u64, 4 * n)?)
    }
}
