//! `y = W x` for a quantized weight matrix and a batch of f32 activations, threaded over
//! output rows with rayon.
//!
//! Two paths, same result up to rounding:
//! - a few tokens (decode): each row is dotted with each token by the fused
//!   dequantize-and-dot kernel ([`octoflow_gguf::quant::dot_row`]); nothing is materialized.
//! - many tokens (prefill): each thread dequantizes a tile of rows to f32 once and multiplies it
//!   with all tokens by a cache-blocked f32 GEMM, so the weights are read and decoded once per
//!   batch instead of once per token.

use rayon::prelude::*;

use octoflow_gguf::quant;

use crate::error::Result;
use crate::weights::QMatrix;

/// Batches of at least this many tokens take the dequantize-then-GEMM path.
pub(crate) const GEMM_MIN_TOKENS: usize = 4;
/// Rows per task on the dot path (amortizes rayon's per-task cost).
const DOT_ROWS_PER_TASK: usize = 32;
/// Largest dequantized tile on the GEMM path, in bytes. Tiles are large because each GEMM call
/// re-packs the whole activation matrix; small tiles made packing dominate the profile.
const GEMM_TILE_BYTES: usize = 4 << 20;
/// Tiles per matrix we aim for at least, so that rayon can balance them over the threads.
const GEMM_MIN_TILES: usize = 8;
/// Fewest rows per tile: each tile re-packs all activations, so thin tiles (the K and V
/// projections of GQA models have only 128 rows) would spend their time packing.
const GEMM_MIN_TILE_ROWS: usize = 64;

/// `out[t, r] = dot(w row r, x[t])`.
///
/// `x` is `[n_tokens, w.n_cols]` and `out` is `[n_tokens, w.n_rows]`, both f32 row-major.
pub fn matmul(w: &QMatrix, x: &[f32], out: &mut [f32]) -> Result<()> {
    debug_assert_eq!(x.len() % w.n_cols, 0);
    let n_tokens = x.len() / w.n_cols;
    debug_assert_eq!(out.len(), n_tokens * w.n_rows);
    if n_tokens < GEMM_MIN_TOKENS {
        for (xt, ot) in x.chunks_exact(w.n_cols).zip(out.chunks_exact_mut(w.n_rows)) {
            matvec(w, xt, ot)?;
        }
        Ok(())
    } else {
        matmul_gemm(w, x, n_tokens, out)
    }
}

/// `out[r] = dot(w row r, x)` for one token, with the fused dequantize-and-dot kernel.
fn matvec(w: &QMatrix, x: &[f32], out: &mut [f32]) -> Result<()> {
    out.par_chunks_mut(DOT_ROWS_PER_TASK)
        .enumerate()
        .try_for_each(|(chunk, o)| {
            let first = chunk * DOT_ROWS_PER_TASK;
            for (i, v) in o.iter_mut().enumerate() {
                *v = quant::dot_row(w.ty, w.row(first + i), x).map_err(|e| w.quant_error(e))?;
            }
            Ok(())
        })
}

/// The many-token path: per tile of rows, dequantize once, then `tile · xᵀ` by f32 GEMM into
/// a transposed result `[n_rows, n_tokens]`, transposed back at the end.
fn matmul_gemm(w: &QMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) -> Result<()> {
    let max_rows = (GEMM_TILE_BYTES / (4 * w.n_cols)).max(1);
    let tile_rows = w
        .n_rows
        .div_ceil(GEMM_MIN_TILES)
        .max(GEMM_MIN_TILE_ROWS)
        .min(max_rows);
    let mut out_t = vec![0f32; w.n_rows * n_tokens];
    out_t
        .par_chunks_mut(tile_rows * n_tokens)
        .enumerate()
        .try_for_each(|(tile, o)| -> Result<()> {
            let rows = o.len() / n_tokens;
            let mut wt = vec![0f32; rows * w.n_cols];
            w.dequantize_rows(tile * tile_rows, &mut wt)?;
            gemm_abt(&wt, x, w.n_cols, o);
            Ok(())
        })?;
    for (r, col) in out_t.chunks_exact(n_tokens).enumerate() {
        for (t, &v) in col.iter().enumerate() {
            out[t * w.n_rows + r] = v;
        }
    }
    Ok(())
}

/// `c[i, j] = dot(a row i, b row j)`: `a` is `[m, k]`, `b` is `[n, k]`, `c` is `[m, n]`.
fn gemm_abt(a: &[f32], b: &[f32], k: usize, c: &mut [f32]) {
    let (m, n) = (a.len() / k, b.len() / k);
    assert!(a.len() == m * k && b.len() == n * k && c.len() == m * n);
    // SAFETY: the assertion above shows that every element the strides reach lies inside
    // the three slices: a[i*k + p] (i < m, p < k), b[j*k + p] (j < n), c[i*n + j].
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            1,
            k as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::gemm_abt;

    #[test]
    fn gemm_abt_matches_the_definition() {
        let (m, n, k) = (5, 7, 9);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut c = vec![0f32; m * n];
        gemm_abt(&a, &b, k, &mut c);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum();
                assert!((c[i * n + j] - want).abs() < 1e-5, "c[{i},{j}]");
            }
        }
    }
}
