//! The batch product of [`crate::linear`] on cooperative matrices (`matmul_coop.comp`,
//! VK_KHR_cooperative_matrix with f16 A/B and f32 accumulators, 16 x 16 x 16):
//! `y[t, y_col + r] (=|+=) dot(f16(W row r), f16(x[t])) (+ bias[r])`.
//!
//! Same operands, layouts and semantics as [`crate::LinearArgs`], except that the weights
//! (after decoding) and the inputs are rounded to f16 before the product, which is summed in
//! f32. For the quantized types the decoded weights mostly fit f16's 11-bit significand
//! (a block scale times a small code), F16 weights are exact, and F32 weights lose everything
//! past 11 bits: ~2⁻¹² relative per weight. The rounding of `x` costs the same. Inputs beyond
//! f16's range (|x| > 65504) overflow to infinity: the caller keeps activations normed.
//!
//! [`crate::Linear`] uses this kernel for batches of [`crate::Tuning::coop_min_tokens`] or more
//! tokens where [`MatmulCoop::supported`] (not on lavapipe, which keeps `matmul.comp`).

use octoflow_gguf::quant::QuantError;
use octoflow_gguf::GgmlType;

use octoflow_vk::{
    BufferSlice, Chain, Context, DeviceCaps, Pipeline, PipelineDesc, Push, Shader, VkError,
};

use crate::error::{KernelError, Result};
use crate::linear::{check_args, glu_cost, linear_ref, product_cost, LinearArgs, PUSH_BYTES};
use crate::qweight::{QOp, TYPES};
use crate::scratch::QueueScratch;
use crate::split_sum::{SplitSum, SumTarget};
use crate::tuning::Tuning;

/// Rows, tokens and columns per workgroup step (`BM`, `BN`, `BK` in `matmul_coop.comp`).
const TILE: [u32; 3] = [128, 64, 64];
/// The same for the wide variants (`matmul_coop_wide_*`, `BN` 128).
const TILE_WIDE: [u32; 3] = [128, 128, 64];
/// The same for the fused gate/up/activation variants (`matmul_coop_glu_*`: `BM` rows of both
/// matrices) and for their small-batch variants (`matmul_coop_glu_small_*`, batches of up to
/// [`GLU_SMALL_MAX_TOKENS`]): half the rows of [`TILE`], so that both matrices' tiles fit the
/// shared memory of one workgroup; 64 tokens per workgroup win for batches up to 64 and 128
/// above (measurements: docs/perf-log/kernel-comment-notes.md).
const TILE_GLU: [u32; 3] = [64, 128, 64];
/// See [`TILE_GLU`].
const TILE_GLU_SMALL: [u32; 3] = [64, 64, 64];
/// See [`TILE_GLU`].
const GLU_SMALL_MAX_TOKENS: u32 = 64;
/// Batches of at least this many tokens may take the wide variants: each weight is decoded half
/// as often, by half as many workgroups — which pays where the wide grid still fills the device
/// ([`WIDE_MIN_TILES`]) or the rows are long enough for split-K pieces of several steps
/// ([`WIDE_MIN_COLS`]); narrower batches are faster with the narrow tile.
pub const WIDE_MIN_TOKENS: u32 = 257;
/// See [`WIDE_MIN_TOKENS`].
const WIDE_MIN_TILES: u32 = 128;
/// Rows, tokens and columns per step of the small variants (`matmul_coop_small_*`: 64 x 64,
/// 2 x 4 subgroups of 32 x 16), for products of at most [`SMALL_MAX_ROWS`] rows of fewer than
/// [`WIDE_MIN_COLS`] columns whose critical path ([`wave_cost`]) is no longer than with
/// 128 x 64 tiles: as long, with fewer split-K pieces to sum (taller or longer products lose
/// with them).
const TILE_SMALL: [u32; 3] = [64, 64, 64];
/// See [`TILE_SMALL`].
const SMALL_MAX_ROWS: u32 = 1024;
/// See [`WIDE_MIN_TOKENS`].
const WIDE_MIN_COLS: u32 = 2048;
/// Invocations per workgroup (`WGS`: 8 subgroups of 32).
const INVOCATIONS: u32 = 256;
/// Most split-K pieces.
const MAX_SPLIT: u32 = 16;
/// The subgroup size the kernel's invocations are laid out for.
const SUBGROUP: u32 = 32;

/// Pipelines of one tile shape, one per weight type (indexed like `TYPES`).
pub(crate) struct Tiled {
    pipelines: Vec<Pipeline>,
    /// Rows, tokens and columns per step of a workgroup of these pipelines.
    tile: [u32; 3],
}

/// The cooperative-matrix matmul pipelines, one per weight type and tile shape, built once.
pub struct MatmulCoop {
    narrow: Tiled,
    /// For batches of [`WIDE_MIN_TOKENS`] or more (absent in benchmark-built instances).
    wide: Option<Tiled>,
    /// For short products of few rows ([`TILE_SMALL`]; absent in benchmark-built instances).
    small: Option<Tiled>,
    /// Gate, up and the activation in one dispatch (`matmul_coop_glu_*`), and the same for
    /// small batches (absent in benchmark-built instances).
    pub(crate) glu: Option<(Tiled, Tiled)>,
    /// Split-K aims at this many workgroups ([`Tuning::matmul_target_groups`]; benchmarks vary
    /// it).
    pub(crate) target_groups: u32,
    /// Adds split-K pieces into y.
    sum: SplitSum,
    /// Split-K partial sums per queue, grown on first need: shared by every dispatch of this
    /// kernel recorded for that queue (each one is fenced by barriers before and after its sum;
    /// submissions to one queue are ordered by those barriers); chains on different queues may
    /// run at once and get their own (a chain's queue must be set before recording).
    scratch: QueueScratch,
}

impl MatmulCoop {
    /// Whether the device runs `matmul_coop.comp`: 16 x 16 x 16 f16 → f32 cooperative matrices,
    /// 16-bit floats, workgroups of 256, full subgroups, and subgroups that are (or can be made)
    /// 32 wide.
    pub fn supported(caps: &DeviceCaps) -> bool {
        let sg = &caps.subgroup;
        caps.coopmat_supports(16, 16, 16, "f16", "f32")
            && caps.shader_float16
            && caps.max_workgroup_invocations >= INVOCATIONS
            && sg.full_subgroups
            && (sg.size == SUBGROUP
                || (sg.size_control && (sg.min_size..=sg.max_size).contains(&SUBGROUP)))
    }

    /// Builds every type's pipeline, split-K sized for the device ([`Tuning::from_caps`]): an
    /// `Unsupported` error where [`MatmulCoop::supported`] is false.
    pub fn new(ctx: &Context) -> Result<Self> {
        Self::with_tuning(ctx, &Tuning::from_caps(ctx.caps()))
    }

    /// [`MatmulCoop::new`] with split-K aiming at `tuning`'s target.
    pub fn with_tuning(ctx: &Context, tuning: &Tuning) -> Result<Self> {
        let caps = ctx.caps();
        if !Self::supported(caps) {
            return Err(KernelError::Vk(VkError::Unsupported {
                device: caps.name.clone(),
                reason: "matmul_coop: no 16x16x16 f16 -> f32 cooperative matrices with full \
                         32-wide subgroups"
                    .into(),
            }));
        }
        let shaders = |op: QOp| (0..TYPES.len()).map(|i| op.variant(i)).collect::<Vec<_>>();
        let mut mm = Self::with_shaders(ctx, &shaders(QOp::MatmulCoop), TILE)?;
        mm.wide = Some(Tiled::new(ctx, &shaders(QOp::MatmulCoopWide), TILE_WIDE)?);
        mm.small = Some(Tiled::new(ctx, &shaders(QOp::MatmulCoopSmall), TILE_SMALL)?);
        mm.glu = Some((
            Tiled::with_bindings(ctx, &shaders(QOp::MatmulCoopGlu), TILE_GLU, 6)?,
            Tiled::with_bindings(ctx, &shaders(QOp::MatmulCoopGluSmall), TILE_GLU_SMALL, 6)?,
        ));
        mm.target_groups = tuning.matmul_target_groups;
        Ok(mm)
    }

    /// Pipelines of `shaders` (indexed like `TYPES`, or one for every type) whose workgroups
    /// cover `tile` rows x tokens x columns per step, for every batch size; split-K sized for
    /// the device.
    pub(crate) fn with_shaders(ctx: &Context, shaders: &[Shader], tile: [u32; 3]) -> Result<Self> {
        Ok(MatmulCoop {
            narrow: Tiled::new(ctx, shaders, tile)?,
            wide: None,
            small: None,
            glu: None,
            target_groups: Tuning::from_caps(ctx.caps()).matmul_target_groups,
            sum: SplitSum::new(ctx)?,
            scratch: QueueScratch::new("matmul_split"),
        })
    }

    /// The pipelines for a product of `n_rows` x `n_cols` over `n_tokens`.
    fn tiled(&self, n_rows: u32, n_cols: u32, n_tokens: u32) -> &Tiled {
        if let Some(w) = self.wide.as_ref().filter(|_| n_tokens >= WIDE_MIN_TOKENS) {
            let tiles = n_rows.div_ceil(w.tile[0]) * n_tokens.div_ceil(w.tile[1]);
            if tiles >= WIDE_MIN_TILES || n_cols >= WIDE_MIN_COLS {
                return w;
            }
        }
        let (n, target) = (&self.narrow, self.target_groups);
        match &self.small {
            Some(s) if prefers_small(n.tile, s.tile, [n_rows, n_cols, n_tokens], target) => s,
            _ => n,
        }
    }

    /// Records `y (=|+=) f16(x) · f16(W)ᵀ (+ bias)` for any batch size, after the checks of
    /// [`crate::Linear::record`]. `y` must not alias `x`, `bias` or the weights.
    pub fn record(&self, chain: &mut Chain, a: &LinearArgs) -> Result<()> {
        let c = check_args(a)?;
        self.dispatch(chain, c.ti, a, &c.bindings, &c.push)
    }

    /// Records the dispatch of checked arguments (`ti`: the type's index in `TYPES`), split
    /// along the columns when the product has too few tiles to fill the device (then followed
    /// by a barrier, the sum of the pieces into y, and another barrier).
    pub(crate) fn dispatch(
        &self,
        chain: &mut Chain,
        ti: usize,
        a: &LinearArgs,
        bindings: &[BufferSlice; 4],
        push: &Push,
    ) -> Result<()> {
        let tiled = self.tiled(a.w.n_rows, a.w.n_cols, a.n_tokens);
        let tile = tiled.tile;
        let tiles = a.w.n_rows.div_ceil(tile[0]) * a.n_tokens.div_ceil(tile[1]);
        let split = split_for(tiles, a.w.n_cols, tile[2], self.target_groups);
        self.dispatch_tiled(chain, tiled, ti, a, bindings, push, split)
    }

    /// [`Self::dispatch`] in (at most) `split` column pieces (tests cover every split).
    #[cfg(test)]
    pub(crate) fn dispatch_split(
        &self,
        chain: &mut Chain,
        ti: usize,
        a: &LinearArgs,
        bindings: &[BufferSlice; 4],
        push: &Push,
        split: u32,
    ) -> Result<()> {
        let tiled = self.tiled(a.w.n_rows, a.w.n_cols, a.n_tokens);
        self.dispatch_tiled(chain, tiled, ti, a, bindings, push, split)
    }

    /// [`Self::dispatch_split`] on the pipelines `tiled`.
    #[allow(clippy::too_many_arguments)]
    fn dispatch_tiled(
        &self,
        chain: &mut Chain,
        tiled: &Tiled,
        ti: usize,
        a: &LinearArgs,
        bindings: &[BufferSlice; 4],
        push: &Push,
        split: u32,
    ) -> Result<()> {
        let (tile, pipeline) = (tiled.tile, tiled.pipeline(ti));
        let steps = a.w.n_cols.div_ceil(tile[2]);
        let per = steps.div_ceil(split.clamp(1, steps.max(1)));
        let split = steps.div_ceil(per).max(1);
        let k_per = per * tile[2];
        let groups = grid(chain, tile, a.w.n_rows, a.n_tokens, split)?;
        let x_vec = x_vec(a.w.n_cols, a.x);
        let push = push.clone().u32(k_per).u32(split).u32(u32::from(x_vec));
        let [w, x, y, bias] = bindings.clone();
        let (cost_bytes, flops) = product_cost(a);
        let outputs = u64::from(a.n_tokens) * u64::from(a.w.n_rows);
        // y written (and read when accumulating): the product's with one piece, else the sum's
        let y_bytes = if a.accumulate { 2 } else { 1 } * 4 * outputs;
        if split == 1 {
            // part is never written: y stands in for the binding
            let all = [w, x, y.clone(), bias, y];
            chain.dispatch(pipeline, &all, &push, groups)?;
            chain.set_cost(cost_bytes, flops);
            return Ok(());
        }
        let bytes = 4 * u64::from(split) * outputs;
        let part = self.scratch.get_slice(chain, bytes)?;
        let all = [w, x, y.clone(), bias.clone(), part.clone()];
        chain.dispatch(pipeline, &all, &push, groups)?;
        // weights and x read, the pieces written (y is not touched)
        chain.set_cost(cost_bytes - y_bytes + bytes, flops);
        chain.compute_barrier()?;
        let target = SumTarget {
            n_rows: a.w.n_rows,
            n_tokens: a.n_tokens,
            y_stride: a.y_stride,
            y_col: a.y_col,
            bias: a.bias.is_some(),
            accumulate: a.accumulate,
        };
        self.sum.record(chain, &part, split, &y, &bias, &target)?;
        // the pieces read, y written (and read when accumulating)
        chain.set_cost(bytes + y_bytes, 0);
        chain.compute_barrier()?;
        Ok(())
    }

    /// Records `y[t, r] = act(gate row r · x[t]) * (up row r · x[t])` on the GLU pipelines
    /// `tiled` (by default the fused pipelines for the batch's size): weights `gate` and `up`
    /// (checked words of one type and shape, type index `ti`, `row_bytes` each), `x` and `y`
    /// checked as one product of the gate. One piece per tile (the activation is not linear: no
    /// split-K).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dispatch_glu(
        &self,
        chain: &mut Chain,
        tiled: Option<&Tiled>,
        ti: usize,
        a: &crate::LinearGluArgs,
        gate: &BufferSlice,
        up: &BufferSlice,
        row_bytes: u32,
    ) -> Result<()> {
        let chosen = self.glu.as_ref().map(|(wide, small)| {
            if a.n_tokens <= GLU_SMALL_MAX_TOKENS {
                small
            } else {
                wide
            }
        });
        let Some(tiled) = tiled.or(chosen) else {
            // benchmark-built instances
            return Err(KernelError::Shape {
                op: "matmul_coop",
                detail: "no fused GLU pipelines on this instance".into(),
            });
        };
        let (tile, pipeline) = (tiled.tile, tiled.pipeline(ti));
        let (n_rows, n_cols) = (a.gate.n_rows, a.gate.n_cols);
        let groups = grid(chain, tile, n_rows, a.n_tokens, 1)?;
        let x_vec = x_vec(n_cols, a.x);
        let k_per = n_cols.div_ceil(tile[2]) * tile[2];
        let push = Push::new()
            .u32(n_rows)
            .u32(n_cols)
            .u32(a.n_tokens)
            .u32(n_rows) // y_stride
            .u32(0) // y_col
            .u32(row_bytes)
            .u32(a.op.code() << 2) // flags: no bias, no accumulation; the activation
            .u32(k_per)
            .u32(1)
            .u32(u32::from(x_vec));
        let y = a.y.clone();
        // y stands in for the bias and split-K bindings (never read or written)
        let all = [
            gate.clone(),
            a.x.clone(),
            y.clone(),
            y.clone(),
            y,
            up.clone(),
        ];
        chain.dispatch(pipeline, &all, &push, groups)?;
        let (bytes, flops) = glu_cost(a);
        chain.set_cost(bytes, flops);
        Ok(())
    }
}

/// The workgroup grid of `tile`s over `n_rows` x `n_tokens` in `split` pieces, or a shape error
/// past the device's limits.
fn grid(chain: &Chain, tile: [u32; 3], n_rows: u32, n_tokens: u32, split: u32) -> Result<[u32; 3]> {
    let groups = [n_rows.div_ceil(tile[0]), n_tokens.div_ceil(tile[1]), split];
    let max = chain.context().caps().max_workgroup_count;
    if groups[0] > max[0] || groups[1] > max[1] {
        return Err(KernelError::Shape {
            op: "matmul_coop",
            detail: format!(
                "{n_rows} rows x {n_tokens} tokens need {}x{} workgroups, over {}x{}",
                groups[0], groups[1], max[0], max[1]
            ),
        });
    }
    Ok(groups)
}

/// Whether the kernel reads x as vec4s: rows of whole vec4s from a 16-byte aligned start.
fn x_vec(n_cols: u32, x: &BufferSlice) -> bool {
    n_cols.is_multiple_of(4) && x.offset.is_multiple_of(16)
}

/// A pipeline of a cooperative-matrix shader (laid out for full subgroups of [`SUBGROUP`],
/// requested where the device's size varies): `bindings` storage buffers, `push` bytes of push
/// constants. The device must be [`MatmulCoop::supported`].
pub(crate) fn coop_pipeline(
    ctx: &Context,
    shader: Shader,
    bindings: u32,
    push: u32,
) -> Result<Pipeline> {
    let sg = &ctx.caps().subgroup;
    let mut desc = PipelineDesc::new(shader, bindings, push);
    if sg.size != SUBGROUP || sg.min_size != sg.max_size {
        desc = desc.subgroup_size(SUBGROUP);
    }
    desc.full_subgroups = true;
    Ok(Pipeline::new(ctx, &desc)?)
}

impl Tiled {
    fn new(ctx: &Context, shaders: &[Shader], tile: [u32; 3]) -> Result<Self> {
        Self::with_bindings(ctx, shaders, tile, 5)
    }

    /// Pipelines of `shaders` with `bindings` storage buffers (the GLU variants read a sixth:
    /// the up matrix).
    pub(crate) fn with_bindings(
        ctx: &Context,
        shaders: &[Shader],
        tile: [u32; 3],
        bindings: u32,
    ) -> Result<Self> {
        let pipelines = shaders
            .iter()
            .map(|&shader| coop_pipeline(ctx, shader, bindings, PUSH_BYTES + 12))
            .collect::<Result<_>>()?;
        Ok(Tiled { pipelines, tile })
    }

    /// The pipeline of type index `ti` (the only one of a single-shader set).
    fn pipeline(&self, ti: usize) -> &Pipeline {
        &self.pipelines[if self.pipelines.len() == 1 { 0 } else { ti }]
    }
}

/// Whether a product of `shape` (rows, columns, tokens) takes the `small` tile instead of the
/// `narrow` one: a short product ([`SMALL_MAX_ROWS`], [`WIDE_MIN_COLS`]) whose critical path
/// ([`wave_cost`]) is no longer with it.
fn prefers_small(narrow: [u32; 3], small: [u32; 3], shape: [u32; 3], target: u32) -> bool {
    let [n_rows, n_cols, _] = shape;
    n_rows <= SMALL_MAX_ROWS
        && n_cols < WIDE_MIN_COLS
        && wave_cost(small, shape, target) <= wave_cost(narrow, shape, target)
}

/// The critical path of a product of `shape` (rows, columns, tokens) in `tile`s, in 64 x 64
/// tile steps: the column steps of one split-K piece ([`split_for`]) times the tile's size,
/// times the rounds of workgroups past `target`.
fn wave_cost(tile: [u32; 3], shape: [u32; 3], target: u32) -> u32 {
    let [n_rows, n_cols, n_tokens] = shape;
    let tiles = n_rows.div_ceil(tile[0]) * n_tokens.div_ceil(tile[1]);
    let steps = n_cols.div_ceil(tile[2]).max(1);
    let per = steps.div_ceil(split_for(tiles, n_cols, tile[2], target));
    let rounds = (tiles * steps.div_ceil(per)).div_ceil(target.max(1));
    rounds * per * (tile[0] * tile[1] / 4096)
}

/// Split-K pieces for a product of `tiles` workgroup tiles over `n_cols` columns in steps of
/// `k`: as many as keep the workgroups within `target` (one wave: the tiles hold one workgroup
/// per compute unit), at least one, at most [`MAX_SPLIT`] and one per step. Rounding down,
/// because a first wave full with a few workgroups in a second costs a whole second round.
fn split_for(tiles: u32, n_cols: u32, k: u32, target: u32) -> u32 {
    let steps = n_cols.div_ceil(k).max(1);
    (target / tiles.max(1)).clamp(1, MAX_SPLIT.min(steps))
}

/// CPU reference: [`linear_ref`] on the operands the kernel multiplies — every decoded weight
/// and every input rounded to f16 (round to nearest even) — summed in f64. Same arguments.
#[allow(clippy::too_many_arguments)]
pub fn matmul_coop_ref(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    y_stride: usize,
    y_col: usize,
    bias: Option<&[f32]>,
    accumulate: bool,
) -> Result<(), QuantError> {
    let rb = octoflow_gguf::quant::quantized_size(ty, n_cols)?;
    let mut w16 = vec![0f32; n_rows * n_cols];
    for (r, row) in w16.chunks_exact_mut(n_cols).enumerate() {
        octoflow_gguf::quant::dequantize(ty, &w[r * rb..(r + 1) * rb], row)?;
    }
    let to_f16 = |v: &f32| half::f16::from_f32(*v).to_f32();
    let w16: Vec<f32> = w16.iter().map(to_f16).collect();
    let x16: Vec<f32> = x[..n_tokens * n_cols].iter().map(to_f16).collect();
    linear_ref(
        GgmlType::F32,
        octoflow_vk::as_bytes(&w16),
        n_rows,
        n_cols,
        &x16,
        n_tokens,
        y,
        y_stride,
        y_col,
        bias,
        accumulate,
    )
}

#[cfg(test)]
#[path = "matmul_coop_tests.rs"]
pub(crate) mod tests;
