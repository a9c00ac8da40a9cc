//! The row-wise pieces of the CPU step, parallel over rows: RMS norm and its backward, the
//! gated activation and its backward, RoPE at each row's own position (and its transpose),
//! dropout masks. The norm and activation math is the kernels' CPU references
//! (`octoflow_kernels::*_ref`), run on chunks of rows at once.

use rayon::prelude::*;

use octoflow_kernels::{
    dropout_uniform, glu_back_ref, glu_ref, rms_norm_back_ref, rms_norm_ref, GluOp,
};
use octoflow_model::{Activation, RopeType};

/// Rows per parallel task (small rows are cheap; the chunk keeps rayon's cost negligible).
const ROWS_PER_TASK: usize = 16;

pub(crate) fn glu_op(act: Activation) -> GluOp {
    match act {
        Activation::Silu => GluOp::Silu,
        Activation::GeluTanh => GluOp::GeluTanh,
    }
}

/// `out = rms_norm(x) · w` per row of `n` values.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], out: &mut [f32], n: usize, eps: f32) {
    let step = ROWS_PER_TASK * n;
    out.par_chunks_mut(step)
        .zip(x.par_chunks(step))
        .for_each(|(o, x)| rms_norm_ref(x, w, o, n, eps));
}

/// `dx (+)= ∂(rms_norm(x) · w)/∂x · dy` per row of `n` values.
pub(crate) fn rms_norm_back(
    x: &[f32],
    w: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    n: usize,
    eps: f32,
    accumulate: bool,
) {
    let step = ROWS_PER_TASK * n;
    dx.par_chunks_mut(step)
        .zip(x.par_chunks(step).zip(dy.par_chunks(step)))
        .for_each(|(dx, (x, dy))| rms_norm_back_ref(x, w, dy, dx, n, eps, accumulate));
}

/// `out = act(gate) · up`.
pub(crate) fn glu(gate: &[f32], up: &[f32], out: &mut [f32], act: Activation) {
    let step = 4096;
    out.par_chunks_mut(step)
        .zip(gate.par_chunks(step).zip(up.par_chunks(step)))
        .for_each(|(o, (g, u))| glu_ref(g, u, o, glu_op(act)));
}

/// `dgate, dup` of `act(gate) · up` given `dh`.
pub(crate) fn glu_back(
    gate: &[f32],
    up: &[f32],
    dh: &[f32],
    dgate: &mut [f32],
    dup: &mut [f32],
    act: Activation,
) {
    let step = 4096;
    dgate
        .par_chunks_mut(step)
        .zip(dup.par_chunks_mut(step))
        .zip(gate.par_chunks(step).zip(up.par_chunks(step)))
        .zip(dh.par_chunks(step))
        .for_each(|(((dg, du), (g, u)), d)| glu_back_ref(g, u, d, dg, du, glu_op(act)));
}

/// `out = dropout(x)` with the trainer's counter-based mask: element `i` of the whole
/// `[T, n]` input is kept (scaled by `1 / (1 - p)`) when `dropout_uniform(seed, salt, i) >= p`,
/// as `octoflow_kernels::dropout_ref` and the GPU's kernel do.
pub(crate) fn dropout(x: &[f32], out: &mut [f32], p: f32, seed: u32, salt: u32) {
    let keep = (1.0 / (1.0 - f64::from(p))) as f32;
    let step = 1 << 14;
    out.par_chunks_mut(step)
        .zip(x.par_chunks(step))
        .enumerate()
        .for_each(|(c, (o, x))| {
            for (j, (o, &v)) in o.iter_mut().zip(x).enumerate() {
                let u = dropout_uniform(seed, salt, (c * step + j) as u32);
                *o = if u >= p { v * keep } else { 0.0 };
            }
        });
}

/// The `(cos, sin)` table of a layer's RoPE for positions `0..=max_pos`: `[pos][pair]`.
pub(crate) fn rope_table(freqs: &[f64], max_pos: u32) -> Vec<(f32, f32)> {
    let mut t = Vec::with_capacity((max_pos as usize + 1) * freqs.len());
    for p in 0..=max_pos {
        for f in freqs {
            let th = f64::from(p) * f;
            t.push((th.cos() as f32, th.sin() as f32));
        }
    }
    t
}

/// Rotates every head of every row by its row's position (`inverse`: the transpose, for
/// gradients). `x` is `[T, heads · head_dim]`; the first `2 · pairs` dimensions rotate.
pub(crate) fn rope(
    x: &mut [f32],
    head_dim: usize,
    kind: RopeType,
    table: &[(f32, f32)],
    pairs: usize,
    pos: &[u32],
    inverse: bool,
) {
    let width = x.len() / pos.len().max(1);
    let sign = if inverse { -1.0 } else { 1.0 };
    x.par_chunks_mut(width)
        .zip(pos.par_iter())
        .for_each(|(row, &p)| {
            let angles = &table[p as usize * pairs..(p as usize + 1) * pairs];
            for head in row.chunks_exact_mut(head_dim) {
                for (i, &(cos, sin)) in angles.iter().enumerate() {
                    let (a, b) = match kind {
                        RopeType::Normal => (2 * i, 2 * i + 1),
                        RopeType::Neox => (i, i + pairs),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    let s = sign * sin;
                    head[a] = x0 * cos - x1 * s;
                    head[b] = x0 * s + x1 * cos;
                }
            }
        });
}
