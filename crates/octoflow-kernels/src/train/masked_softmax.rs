//! Masked softmax of attention scores, forward and backward (shader `masked_softmax.comp`), for
//! training's materialized attention: causal within each document of a packed sequence, with an
//! optional sliding window.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

/// Which keys each query row sees, for scores laid out
/// `[n_seq, n_head, seq_len (query i), seq_len (key j)]` f32.
pub struct SoftmaxMask<'a> {
    /// u32 positions: row i of sequence s is at position
    /// `p = pos[pos_offset + (s*seq_len + i) * pos_stride]` of its own document (stride 2 for the
    /// (position, row) tables of `Positions::Table`); it sees keys j with `i - p <= j <= i`
    /// (`p > i` is read as `p = i`), and with `window > 0` only those with `i - j < window`.
    pub pos: &'a BufferSlice,
    /// Index of row (0, 0)'s position in `pos`.
    pub pos_offset: u32,
    /// u32 words from one row's position to the next.
    pub pos_stride: u32,
    /// Sequences.
    pub n_seq: u32,
    /// Heads per sequence.
    pub n_head: u32,
    /// Rows (queries) and keys per sequence.
    pub seq_len: u32,
    /// Sliding window in keys (0: none).
    pub window: u32,
    /// Multiplies the scores before the softmax (1/sqrt(head_dim)).
    pub scale: f32,
}

/// The masked softmax kernels, built once per device.
pub struct MaskedSoftmax {
    pipeline: Pipeline,
}

impl MaskedSoftmax {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(MaskedSoftmax {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::MASKED_SOFTMAX, 3, 32))?,
        })
    }

    /// In place: `x[s,h,i,j] = softmax over visible j of scale*x[s,h,i,j]`; invisible entries are
    /// written 0 (and not read). One workgroup per row.
    pub fn forward(&self, chain: &mut Chain, x: &BufferSlice, mask: &SoftmaxMask) -> Result<()> {
        self.dispatch(chain, "masked_softmax", x, x, mask, false)
    }

    /// Given p (forward's output) and dp = ∂L/∂p, writes in place over dp:
    /// `ds = scale * p * (dp - Σ_j p*dp)` (the gradient w.r.t. the raw, unscaled scores, the sum
    /// over visible j); invisible entries 0 (and not read). One workgroup per row.
    pub fn backward(
        &self,
        chain: &mut Chain,
        p: &BufferSlice,
        dp: &BufferSlice,
        mask: &SoftmaxMask,
    ) -> Result<()> {
        need("masked_softmax_back", "p", p, scores(mask))?;
        self.dispatch(chain, "masked_softmax_back", p, dp, mask, true)
    }

    /// Checks the mask and `b` and records one dispatch over every row.
    fn dispatch(
        &self,
        chain: &mut Chain,
        op: &'static str,
        a: &BufferSlice,
        b: &BufferSlice,
        m: &SoftmaxMask,
        backward: bool,
    ) -> Result<()> {
        let rows = u128::from(m.n_seq) * u128::from(m.n_head) * u128::from(m.seq_len);
        if rows == 0 {
            let detail = format!(
                "empty shape: {} sequences, {} heads, seq_len {}",
                m.n_seq, m.n_head, m.seq_len
            );
            return Err(bad(op, detail));
        }
        let total = scores(m);
        if total > u128::from(u32::MAX) {
            return Err(bad(op, format!("{total} scores exceed u32 indexing")));
        }
        let name = if backward { "dp" } else { "x" };
        need(op, name, b, total)?;
        let pos_rows = u128::from(m.n_seq) * u128::from(m.seq_len);
        let words = u128::from(m.pos_offset) + (pos_rows - 1) * u128::from(m.pos_stride) + 1;
        if words > u128::from(u32::MAX) {
            return Err(bad(op, format!("pos index {words} exceeds u32")));
        }
        need(op, "pos", m.pos, words)?;
        if !m.scale.is_finite() {
            return Err(bad(op, format!("scale {}", m.scale)));
        }
        let groups = chain.context().groups_1d(rows as u64, 1)?;
        let push = Push::new()
            .u32(rows as u32)
            .u32(m.n_head)
            .u32(m.seq_len)
            .u32(m.pos_offset)
            .u32(m.pos_stride)
            .u32(m.window)
            .f32(m.scale)
            .u32(u32::from(backward));
        chain.dispatch(
            &self.pipeline,
            &[a.clone(), b.clone(), m.pos.clone()],
            &push,
            groups,
        )?;
        Ok(())
    }
}

/// Scores in the `[n_seq, n_head, seq_len, seq_len]` tensor of `m`.
fn scores(m: &SoftmaxMask) -> u128 {
    u128::from(m.n_seq) * u128::from(m.n_head) * u128::from(m.seq_len) * u128::from(m.seq_len)
}

/// The keys `lo..=i` that row `i` of sequence `s` sees (see [`SoftmaxMask`]); `pos` starts at
/// row (0, 0)'s position.
fn visible(
    pos: &[u32],
    pos_stride: usize,
    s: usize,
    i: usize,
    seq_len: usize,
    window: usize,
) -> std::ops::RangeInclusive<usize> {
    let p = pos[(s * seq_len + i) * pos_stride] as usize;
    let mut lo = i - p.min(i);
    if window > 0 {
        lo = lo.max((i + 1).saturating_sub(window));
    }
    lo..=i
}

/// CPU reference of [`MaskedSoftmax::forward`] (f64 inside): `x`
/// `[n_seq, n_head, seq_len, seq_len]` in place; `pos` holds row (s, i)'s position at
/// `(s*seq_len + i) * pos_stride` (the mask of [`SoftmaxMask`], `pos_offset` already applied).
#[allow(clippy::too_many_arguments)]
pub fn masked_softmax_ref(
    x: &mut [f32],
    pos: &[u32],
    pos_stride: usize,
    n_seq: usize,
    n_head: usize,
    seq_len: usize,
    window: usize,
    scale: f32,
) {
    let scale = f64::from(scale);
    for (r, row) in x
        .chunks_exact_mut(seq_len)
        .enumerate()
        .take(n_seq * n_head * seq_len)
    {
        let (s, i) = (r / seq_len / n_head, r % seq_len);
        let seen = visible(pos, pos_stride, s, i, seq_len, window);
        let max = seen
            .clone()
            .map(|j| scale * f64::from(row[j]))
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = seen
            .clone()
            .map(|j| (scale * f64::from(row[j]) - max).exp())
            .sum();
        for (j, v) in row.iter_mut().enumerate() {
            *v = if seen.contains(&j) {
                ((scale * f64::from(*v) - max).exp() / sum) as f32
            } else {
                0.0
            };
        }
    }
}

/// CPU reference of [`MaskedSoftmax::backward`] (f64 inside): given `p` (the forward's output)
/// and `dp`, both `[n_seq, n_head, seq_len, seq_len]`, writes over `dp`
/// `scale * p * (dp - Σ_visible p*dp)` on visible entries and 0 elsewhere.
#[allow(clippy::too_many_arguments)]
pub fn masked_softmax_back_ref(
    p: &[f32],
    dp: &mut [f32],
    pos: &[u32],
    pos_stride: usize,
    n_seq: usize,
    n_head: usize,
    seq_len: usize,
    window: usize,
    scale: f32,
) {
    let scale = f64::from(scale);
    let rows = p.chunks_exact(seq_len).zip(dp.chunks_exact_mut(seq_len));
    for (r, (pr, dr)) in rows.enumerate().take(n_seq * n_head * seq_len) {
        let (s, i) = (r / seq_len / n_head, r % seq_len);
        let seen = visible(pos, pos_stride, s, i, seq_len, window);
        let d: f64 = seen
            .clone()
            .map(|j| f64::from(pr[j]) * f64::from(dr[j]))
            .sum();
        for (j, g) in dr.iter_mut().enumerate() {
            *g = if seen.contains(&j) {
                (scale * f64::from(pr[j]) * (f64::from(*g) - d)) as f32
            } else {
                0.0
            };
        }
    }
}

#[cfg(test)]
#[path = "masked_softmax_tests.rs"]
mod tests;
