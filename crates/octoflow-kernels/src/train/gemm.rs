//! Strided, batched f32 matrix product (shader `gemm.comp`), for training: LoRA products and
//! materialized attention (`S = Q·Kᵀ`, `O = P·V`, their backward).
//!
//! For every `b1 < batch[0]`, `b2 < batch[1]`, `i < m`, `j < n`:
//!
//! ```text
//! C[b1*c_batch[0] + b2*c_batch[1] + i*c_row + j] =
//!     alpha * Σ_{g<groups} Σ_{kk<k} A[b1*a_s.batch[0] + b2*a_s.batch[1] + g*a_s.group + i*a_s.row + kk*a_s.col]
//!                                 * B[b1*b_s.batch[0] + (b2/b_div)*b_s.batch[1] + g*b_s.group + kk*b_s.row + j*b_s.col]
//!   + beta * C[...]            (C is not read when beta == 0)
//! ```
//!
//! All indices are f32 elements from the start of the operand's slice. Transposes are strides:
//! `X·Wᵀ` with `W` `[n, k]` row-major is `b_s = Strides { row: 1, col: k, .. }`.

use octoflow_vk::{BufferSlice, Chain, Context, DeviceKind, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

const OP: &str = "gemm";

/// Bytes of the push-constant block of `gemm.comp` (20 u32 and 2 f32).
const PUSH_BYTES: u32 = 88;

/// Element strides (in f32 elements, relative to the operand slice's start) of one operand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Strides {
    /// Between rows (the first index: i of A, kk of B).
    pub row: u32,
    /// Between columns (the second index: kk of A, j of B).
    pub col: u32,
    /// Per outer batch index b1 and per inner batch index b2.
    pub batch: [u32; 2],
    /// Per summed group g (see `GemmArgs::groups`).
    pub group: u32,
}

/// One product for [`Gemm::record`]; the semantics are in the module documentation.
#[derive(Clone, Copy)]
pub struct GemmArgs<'a> {
    /// Left operand, f32, addressed through `a_s`.
    pub a: &'a BufferSlice,
    /// A's strides (row: per i, col: per kk).
    pub a_s: Strides,
    /// Right operand, f32, addressed through `b_s`.
    pub b: &'a BufferSlice,
    /// B's strides (row: per kk, col: per j).
    pub b_s: Strides,
    /// B's inner batch index is b2 / b_div (>= 1): grouped-query attention (several query heads share one key head).
    pub b_div: u32,
    /// Output, f32. Distinct (b1, b2, i, j) must address distinct elements, and C must not
    /// overlap A or B.
    pub c: &'a BufferSlice,
    /// C's row stride (its column stride is 1) and its batch strides [b1, b2].
    pub c_row: u32,
    /// C's strides per outer and inner batch index.
    pub c_batch: [u32; 2],
    /// Rows of C (and of A).
    pub m: u32,
    /// Columns of C (and of B).
    pub n: u32,
    /// Summed length (columns of A, rows of B) per group.
    pub k: u32,
    /// Number of groups summed (>= 1).
    pub groups: u32,
    /// Batch counts [b1, b2] (each >= 1).
    pub batch: [u32; 2],
    /// Scale of the product.
    pub alpha: f32,
    /// C = alpha * sum + beta * C; beta == 0 never reads C (a NaN there is overwritten).
    pub beta: f32,
}

/// The GEMM kernel, built once per device.
pub struct Gemm {
    pipeline: Pipeline,
    /// Side of the square C block one workgroup computes (the shader's `TILE`).
    tile: u32,
}

impl Gemm {
    /// Builds the pipeline: 64x64 tiles of 256 invocations on GPUs, 32x32 tiles of 64
    /// invocations on CPU drivers (lavapipe), where small products would waste most of a big tile.
    pub fn new(ctx: &Context) -> Result<Self> {
        let tile = if ctx.caps().kind == DeviceKind::Cpu {
            32
        } else {
            64
        };
        Self::with_tile(ctx, tile)
    }

    /// Builds the variant with `tile` x `tile` C blocks (32 or 64; tests run both anywhere).
    pub(crate) fn with_tile(ctx: &Context, tile: u32) -> Result<Self> {
        let shader = if tile == 32 {
            shaders::GEMM_T32
        } else {
            shaders::GEMM_T64
        };
        let tile = if tile == 32 { 32 } else { 64 };
        Ok(Gemm {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shader, 3, PUSH_BYTES))?,
            tile,
        })
    }

    /// Records `C = alpha * Σ_g A·B + beta * C` over every batch index (see the module
    /// documentation). Checks that every dimension is nonzero, `b_div >= 1`, and that the largest
    /// element index each operand can touch lies inside its slice.
    pub fn record(&self, chain: &mut Chain, args: &GemmArgs) -> Result<()> {
        let GemmArgs {
            a_s,
            b_s,
            b_div,
            c_row,
            c_batch,
            m,
            n,
            k,
            groups,
            batch,
            alpha,
            beta,
            ..
        } = *args;
        let dims = [
            ("m", m),
            ("n", n),
            ("k", k),
            ("groups", groups),
            ("batch[0]", batch[0]),
            ("batch[1]", batch[1]),
            ("b_div", b_div),
        ];
        if let Some((name, _)) = dims.iter().find(|(_, v)| *v == 0) {
            return Err(bad(
                OP,
                format!(
                    "{name} is 0 (m {m}, n {n}, k {k}, groups {groups}, batch {batch:?}, b_div {b_div})"
                ),
            ));
        }
        // Largest index along one axis: (count - 1) * stride.
        let last = |count: u32, stride: u32| u128::from(count - 1) * u128::from(stride);
        let a_max = last(batch[0], a_s.batch[0])
            + last(batch[1], a_s.batch[1])
            + last(groups, a_s.group)
            + last(m, a_s.row)
            + last(k, a_s.col);
        let b_max = last(batch[0], b_s.batch[0])
            + u128::from((batch[1] - 1) / b_div) * u128::from(b_s.batch[1])
            + last(groups, b_s.group)
            + last(k, b_s.row)
            + last(n, b_s.col);
        let c_max =
            last(batch[0], c_batch[0]) + last(batch[1], c_batch[1]) + last(m, c_row) + last(n, 1);
        for (name, slice, max) in [
            ("a", args.a, a_max),
            ("b", args.b, b_max),
            ("c", args.c, c_max),
        ] {
            // The shader indexes with u32 (every partial sum is <= the maximum).
            if max > u128::from(u32::MAX) {
                let detail = format!(
                    "{name} ({}): largest index {max} does not fit 32 bits",
                    slice.buffer.name()
                );
                return Err(bad(OP, detail));
            }
            need(OP, name, slice, max + 1)?;
        }
        let n_batch = u64::from(batch[0]) * u64::from(batch[1]);
        if n_batch > u64::from(u32::MAX) {
            return Err(bad(OP, format!("{batch:?} batches overflow 32 bits")));
        }
        // The shader loops over each grid axis with the grid's size as its step, so clamping
        // to the device's limits stays complete.
        let max = chain.context().caps().max_workgroup_count;
        let tile = u64::from(self.tile);
        let clamp = |count: u64, limit: u32| count.min(u64::from(limit)) as u32;
        let grid = [
            clamp(u64::from(n).div_ceil(tile), max[0]),
            clamp(u64::from(m).div_ceil(tile), max[1]),
            clamp(n_batch, max[2]),
        ];
        let push = Push::new()
            .u32(a_s.row)
            .u32(a_s.col)
            .u32(a_s.batch[0])
            .u32(a_s.batch[1])
            .u32(a_s.group)
            .u32(b_s.row)
            .u32(b_s.col)
            .u32(b_s.batch[0])
            .u32(b_s.batch[1])
            .u32(b_s.group)
            .u32(b_div)
            .u32(c_row)
            .u32(c_batch[0])
            .u32(c_batch[1])
            .u32(m)
            .u32(n)
            .u32(k)
            .u32(groups)
            .u32(batch[0])
            .u32(batch[1])
            .f32(alpha)
            .f32(beta);
        chain.dispatch(
            &self.pipeline,
            &[args.a.clone(), args.b.clone(), args.c.clone()],
            &push,
            grid,
        )?;
        Ok(())
    }
}

/// CPU reference with the same semantics over plain slices (f64 accumulation).
#[allow(clippy::too_many_arguments)]
pub fn gemm_ref(
    a: &[f32],
    a_s: Strides,
    b: &[f32],
    b_s: Strides,
    b_div: u32,
    c: &mut [f32],
    c_row: u32,
    c_batch: [u32; 2],
    m: usize,
    n: usize,
    k: usize,
    groups: usize,
    batch: [usize; 2],
    alpha: f32,
    beta: f32,
) {
    let u = |x: u32| x as usize;
    for b1 in 0..batch[0] {
        for b2 in 0..batch[1] {
            let a_base = b1 * u(a_s.batch[0]) + b2 * u(a_s.batch[1]);
            let b_base = b1 * u(b_s.batch[0]) + (b2 / u(b_div)) * u(b_s.batch[1]);
            let c_base = b1 * u(c_batch[0]) + b2 * u(c_batch[1]);
            for i in 0..m {
                for j in 0..n {
                    let mut sum = 0f64;
                    for g in 0..groups {
                        for kk in 0..k {
                            let x = a[a_base + g * u(a_s.group) + i * u(a_s.row) + kk * u(a_s.col)];
                            let y = b[b_base + g * u(b_s.group) + kk * u(b_s.row) + j * u(b_s.col)];
                            sum += f64::from(x) * f64::from(y);
                        }
                    }
                    let ci = c_base + i * u(c_row) + j;
                    let mut v = f64::from(alpha) * sum;
                    if beta != 0.0 {
                        v += f64::from(beta) * f64::from(c[ci]);
                    }
                    c[ci] = v as f32;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "gemm_tests.rs"]
mod tests;
