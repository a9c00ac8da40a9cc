//! The operands of a linear product and their checks: the weight matrix, the product's and
//! the fused gate/up/activation's arguments, a post-norm left pending on the input, and what a
//! dispatch moves and computes (for profiles).

use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Push};

use super::plan::MatvecPlan;
use super::qweight::{check_words, row_bytes, type_index, word_slice};
use super::OP;
use crate::error::{KernelError, Result};
use crate::glu::GluOp;
use crate::operand::overlap;

/// A weight matrix on the device in its GGUF encoding: `n_rows` rows of `n_cols` elements.
#[derive(Clone, Copy)]
pub struct QWeightRef<'a> {
    /// Element type of the encoding.
    pub ty: GgmlType,
    /// The rows, `n_rows * quantized_size(ty, n_cols)` bytes.
    pub data: &'a BufferSlice,
    /// Output features.
    pub n_rows: u32,
    /// Input features (a multiple of the type's block size).
    pub n_cols: u32,
}

/// y[t, y_col + r] (=|+=) dot(W row r, x[t]) (+ bias[r]), for t < n_tokens, r < n_rows.
pub struct LinearArgs<'a> {
    /// The weights.
    pub w: QWeightRef<'a>,
    /// `[n_tokens, n_cols]` f32, contiguous rows.
    pub x: &'a BufferSlice,
    /// `[n_tokens, y_stride]` f32.
    pub y: &'a BufferSlice,
    /// Tokens in the batch.
    pub n_tokens: u32,
    /// Floats between consecutive tokens' outputs; `>= y_col + n_rows`.
    pub y_stride: u32,
    /// First output column written (lets a caller split a huge matrix by rows).
    pub y_col: u32,
    /// `[n_rows]` f32, added to every token's output.
    pub bias: Option<&'a BufferSlice>,
    /// Add into y instead of overwriting (fused residual add).
    pub accumulate: bool,
    /// RMSNorm fused on the input: the product is of `rms_norm(x[t]) * weight` (eps given), with
    /// `weight` `[n_cols]` f32. Only where [`Linear::fuses_norm`] says so (the matvec path).
    pub norm: Option<(&'a BufferSlice, f32)>,
    /// A post-norm left pending on the input (with `norm`, one token): see [`PendingNorm`].
    pub pending: Option<PendingNorm<'a>>,
}

/// A residual stream whose last block's post-norm (gemma3's post-attention and post-FFN norms)
/// is left to its consumer: the input of a fused-norm matvec becomes `x + rms_norm(p) * weight`
/// (the norm's eps), which saves the post-norm's own barrier stage. Single tokens on the GPU
/// matvec only ([`Linear::fuses_norm`], `n_cols` a multiple of 32).
#[derive(Clone, Copy)]
pub struct PendingNorm<'a> {
    /// The block's output, `[n_cols]` f32.
    pub p: &'a BufferSlice,
    /// The post-norm's weight, `[n_cols]` f32.
    pub weight: &'a BufferSlice,
    /// Where to write the settled stream `x + rms_norm(p) * weight` (`[n_cols]` f32, apart from
    /// x, p and the output), if anywhere.
    pub settle: Option<&'a BufferSlice>,
}

/// `y[t * n_rows + r] = act(dot(gate row r, x[t])) * dot(up row r, x[t])` for t < n_tokens,
/// r < n_rows: an FFN's gated linear unit in one dispatch ([`Linear::record_glu`]), where
/// [`Linear::fuses_glu`] says so.
pub struct LinearGluArgs<'a> {
    /// The gate matrix.
    pub gate: QWeightRef<'a>,
    /// The up matrix: the gate's type and shape.
    pub up: QWeightRef<'a>,
    /// `[n_tokens, n_cols]` f32, contiguous rows.
    pub x: &'a BufferSlice,
    /// `[n_tokens, n_rows]` f32, contiguous rows; must not alias `x` or the weights.
    pub y: &'a BufferSlice,
    /// Tokens in the batch, 1 ..= [`MATVEC_MAX_TOKENS`].
    pub n_tokens: u32,
    /// The activation of the gate (as [`crate::Glu`]).
    pub op: GluOp,
    /// RMSNorm fused on the input, as [`LinearArgs::norm`] (both products are of
    /// `rms_norm(x[t]) * weight`). Only where [`Linear::fuses_norm`] says so.
    pub norm: Option<(&'a BufferSlice, f32)>,
    /// A post-norm pending on the input, as [`LinearArgs::pending`].
    pub pending: Option<PendingNorm<'a>>,
}
/// What the product of `a` moves and computes, for profiles ([`Chain::set_cost`]): the
/// weights, x, and y written (and read when accumulating); 2 flops per weight and token.
pub(crate) fn product_cost(a: &LinearArgs) -> (u64, u64) {
    let (rows, cols, n) = (
        u64::from(a.w.n_rows),
        u64::from(a.w.n_cols),
        u64::from(a.n_tokens),
    );
    let y_passes = if a.accumulate { 2 } else { 1 };
    let bytes = a.w.data.size + 4 * n * cols + y_passes * 4 * n * rows;
    (bytes, 2 * rows * cols * n)
}

/// What a fused gate/up/activation dispatch moves and computes (profile floors): both matrices,
/// x and y; 2 flops per weight and token in each product.
pub(crate) fn glu_cost(a: &LinearGluArgs) -> (u64, u64) {
    let (rows, cols, n) = (
        u64::from(a.gate.n_rows),
        u64::from(a.gate.n_cols),
        u64::from(a.n_tokens),
    );
    let bytes = a.gate.data.size + a.up.data.size + 4 * n * (cols + rows);
    (bytes, 4 * rows * cols * n)
}
/// The push flags and bindings (input, weight, settled output) of a pending post-norm on the
/// input of a GPU matvec in the layout `plan` (flags 0 and no bindings without one), or a shape
/// error: it needs one token on a one-token layout, `n_cols` a multiple of 32 (whole chunks),
/// `n_cols` floats in each operand, and the settled output apart from what the dispatch reads
/// and writes.
pub(super) fn check_pending(
    pending: Option<PendingNorm>,
    w: &QWeightRef,
    x: &BufferSlice,
    y: &BufferSlice,
    n_tokens: u32,
    plan: MatvecPlan,
) -> Result<(u32, Option<[BufferSlice; 3]>)> {
    let Some(pn) = pending else {
        return Ok((0, None));
    };
    let shape = |detail: String| KernelError::Shape { op: OP, detail };
    if n_tokens != 1 || plan.maxt != 1 || !w.n_cols.is_multiple_of(32) {
        return Err(shape(format!(
            "a pending post-norm takes one token of a row whose length is a multiple of 32 \
             ({n_tokens} tokens of {}, layout {plan:?})",
            w.n_cols
        )));
    }
    let n = u64::from(w.n_cols);
    check_words(OP, "pending input", pn.p, n, "floats")?;
    check_words(OP, "post-norm weight", pn.weight, n, "floats")?;
    let settle = match pn.settle {
        Some(st) => {
            check_words(OP, "settled stream", st, n, "floats")?;
            if [x, y, pn.p, pn.weight, w.data]
                .iter()
                .any(|b| overlap(st, b))
            {
                return Err(shape(
                    "the settled stream must not overlap x, y, the pending input, its weight or \
                     the weights"
                        .into(),
                ));
            }
            st.clone()
        }
        None => y.clone(),
    };
    let flags = 1 | (u32::from(pn.settle.is_some()) << 1);
    Ok((flags, Some([pn.p.clone(), pn.weight.clone(), settle])))
}
/// What [`check_args`] derives from valid arguments.
pub(crate) struct Checked {
    /// Index of the weight type in `TYPES`.
    pub ti: usize,
    /// The 7 push constants every linear shader reads.
    pub push: Push,
    /// Weights (whole words), x, y, bias (x when absent: never read).
    pub bindings: [BufferSlice; 4],
}

/// Checks the type, the shapes and every operand's size (a shape error naming the operand).
pub(crate) fn check_args(a: &LinearArgs) -> Result<Checked> {
    let shape = |detail: String| KernelError::Shape { op: OP, detail };
    let w = &a.w;
    let ti = type_index(OP, w.ty)?;
    let rb = row_bytes(OP, w.ty, w.n_cols)?;
    if w.n_rows == 0 || a.n_tokens == 0 {
        return Err(shape(format!(
            "empty product: n_rows = {}, n_tokens = {}",
            w.n_rows, a.n_tokens
        )));
    }
    let data = word_slice(OP, "weights", w.data, u64::from(w.n_rows) * u64::from(rb))?;
    check_words(
        OP,
        "x",
        a.x,
        u64::from(a.n_tokens) * u64::from(w.n_cols),
        "floats",
    )?;
    let row_end = u64::from(a.y_col) + u64::from(w.n_rows);
    if u64::from(a.y_stride) < row_end {
        return Err(shape(format!(
            "y_stride {} < y_col {} + n_rows {}",
            a.y_stride, a.y_col, w.n_rows
        )));
    }
    let y_floats = u64::from(a.n_tokens - 1) * u64::from(a.y_stride) + row_end;
    check_words(OP, "y", a.y, y_floats, "floats")?;
    if let Some(b) = a.bias {
        check_words(OP, "bias", b, u64::from(w.n_rows), "floats")?;
    }
    let flags = u32::from(a.bias.is_some()) | (u32::from(a.accumulate) << 1);
    let push = Push::new()
        .u32(w.n_rows)
        .u32(w.n_cols)
        .u32(a.n_tokens)
        .u32(a.y_stride)
        .u32(a.y_col)
        .u32(rb)
        .u32(flags);
    // Without a bias, x stands in for the fixed binding (never read).
    let bias = a.bias.unwrap_or(a.x).clone();
    let bindings = [data, a.x.clone(), a.y.clone(), bias];
    Ok(Checked { ti, push, bindings })
}
