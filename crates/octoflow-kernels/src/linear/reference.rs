//! CPU references of the linear products: the specification the shaders are tested against.

use octoflow_gguf::quant::QuantError;
use octoflow_gguf::GgmlType;

use crate::glu::{glu_ref, GluOp};

/// CPU reference: each weight row dequantized with `octoflow_gguf` and dotted with `x[t]` in
/// f64; `y[t * y_stride + y_col + r] = dot (+ bias[r])`, or `+=` with `accumulate`.
/// `w`: `n_rows` rows of `quantized_size(ty, n_cols)` bytes; `x`: `[n_tokens, n_cols]`;
/// `y`: at least `(n_tokens - 1) * y_stride + y_col + n_rows` floats.
#[allow(clippy::too_many_arguments)]
pub fn linear_ref(
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
    let mut row = vec![0f32; n_cols];
    for r in 0..n_rows {
        octoflow_gguf::quant::dequantize(ty, &w[r * rb..(r + 1) * rb], &mut row)?;
        for t in 0..n_tokens {
            let xt = &x[t * n_cols..(t + 1) * n_cols];
            let mut s: f64 = row
                .iter()
                .zip(xt)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            if let Some(b) = bias {
                s += f64::from(b[r]);
            }
            let o = &mut y[t * y_stride + y_col + r];
            if accumulate {
                s += f64::from(*o);
            }
            *o = s as f32;
        }
    }
    Ok(())
}

/// CPU reference of [`super::Linear::record_glu`]: the gate and up products as [`linear_ref`], then
/// [`glu_ref`]: `y[t * n_rows + r] = act(gate_t[r]) * up_t[r]`. `gate`, `up`: `n_rows` rows of
/// `quantized_size(ty, n_cols)` bytes; `x`: `[n_tokens, n_cols]`; `y`: `[n_tokens, n_rows]`. (A
/// fused norm is the product of `rms_norm_ref(x)`.)
#[allow(clippy::too_many_arguments)]
pub fn linear_glu_ref(
    ty: GgmlType,
    gate: &[u8],
    up: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    n_tokens: usize,
    y: &mut [f32],
    op: GluOp,
) -> Result<(), QuantError> {
    let n = n_tokens * n_rows;
    let (mut g, mut u) = (vec![0f32; n], vec![0f32; n]);
    for (w, out) in [(gate, &mut g), (up, &mut u)] {
        linear_ref(
            ty, w, n_rows, n_cols, x, n_tokens, out, n_rows, 0, None, false,
        )?;
    }
    glu_ref(&g, &u, &mut y[..n], op);
    Ok(())
}
