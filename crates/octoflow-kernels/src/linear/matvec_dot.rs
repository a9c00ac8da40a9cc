//! One token of a Q4_K, Q5_K or Q6_K product on 8-bit integer dot products (`matvec_dot.comp`):
//! x quantized per block of 32 values as llama.cpp's q8_1 inside each workgroup, the weights'
//! codes dotted with its codes four at a time. What [`super::Linear::record`] (all three) and
//! [`super::Linear::record_glu`] (Q4_K, Q5_K) take for one-token products where [`MatvecDot::fits`]
//! and [`crate::Tuning::matvec_dot`] say so; [`matvec_dot_ref`] is its CPU reference.

use octoflow_gguf::quant::QuantError;
use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Context, Push};

use super::args::{glu_cost, product_cost};
use super::{LinearArgs, LinearGluArgs, MATVEC_TPR, PUSH_BYTES};
use crate::error::Result;
use crate::glu::{glu_ref, GluOp};
use crate::shaders;
use crate::spec::SpecPipelines;

/// Widest row the shader's shared memory holds (`MAX_COLS` in `matvec_dot.comp`).
pub const MATVEC_DOT_MAX_COLS: u32 = 16384;
/// Invocations per workgroup and rows a row group of 32 lanes takes at once (`WG`, `RPT`).
const WG: u32 = 256;
const RPT: u32 = 2;
/// Values per quantized block of x.
const QK: usize = 32;

/// The shader's pipelines (Q4_K and Q5_K plain and GLU, Q6_K plain), for devices with integer
/// dot products.
pub(crate) struct MatvecDot {
    q4k: SpecPipelines,
    q4k_glu: SpecPipelines,
    q5k: SpecPipelines,
    q5k_glu: SpecPipelines,
    q6k: SpecPipelines,
}

impl MatvecDot {
    /// The pipelines (built on first use), with the subgroup size the matvec requires, or `None`
    /// where the device has no integer dot products.
    pub(crate) fn new(ctx: &Context, subgroup: Option<u32>) -> Option<Self> {
        ctx.caps().integer_dot_product.then(|| MatvecDot {
            q4k: SpecPipelines::new(shaders::MATVEC_DOT_Q4_K, 5, PUSH_BYTES + 8, "dot_q4_k")
                .subgroup_size(subgroup),
            q5k: SpecPipelines::new(shaders::MATVEC_DOT_Q5_K, 5, PUSH_BYTES + 8, "dot_q5_k")
                .subgroup_size(subgroup),
            q6k: SpecPipelines::new(shaders::MATVEC_DOT_Q6_K, 5, PUSH_BYTES + 8, "dot_q6_k")
                .subgroup_size(subgroup),
            q5k_glu: SpecPipelines::new(
                shaders::MATVEC_DOT_GLU_Q5_K,
                6,
                PUSH_BYTES + 12,
                "dot_glu_q5_k",
            )
            .subgroup_size(subgroup),
            q4k_glu: SpecPipelines::new(
                shaders::MATVEC_DOT_GLU_Q4_K,
                6,
                PUSH_BYTES + 12,
                "dot_glu_q4_k",
            )
            .subgroup_size(subgroup),
        })
    }

    /// Whether the kernel reads this product (`glu`: the fused gate/up, not Q6_K): one token
    /// of Q4_K, Q5_K or Q6_K rows of whole super-blocks, at most [`MATVEC_DOT_MAX_COLS`] wide, from
    /// 16-byte aligned offsets, no pending post-norm.
    pub(crate) fn fits(
        ty: GgmlType,
        glu: bool,
        n_cols: u32,
        n_tokens: u32,
        pending: bool,
        w: &[&BufferSlice],
    ) -> bool {
        (matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) || (ty == GgmlType::Q6_K && !glu))
            && n_tokens == 1
            && !pending
            && n_cols.is_multiple_of(256)
            && n_cols <= MATVEC_DOT_MAX_COLS
            && w.iter().all(|s| s.offset.is_multiple_of(16))
    }

    fn groups(chain: &Chain, n_rows: u32) -> Result<[u32; 3]> {
        Ok(chain
            .context()
            .groups_1d(u64::from(n_rows), WG / MATVEC_TPR * RPT)?)
    }

    /// Records checked arguments (`push`: [`super::check_args`]' seven words; `bindings`: weights,
    /// x, y, bias) that [`MatvecDot::fits`].
    pub(crate) fn record(
        &self,
        chain: &mut Chain,
        a: &LinearArgs,
        bindings: &[BufferSlice; 4],
        push: Push,
    ) -> Result<()> {
        let pipelines = match a.w.ty {
            GgmlType::Q5_K => &self.q5k,
            GgmlType::Q6_K => &self.q6k,
            _ => &self.q4k,
        };
        let pl = pipelines.get(chain.context(), [WG, RPT, 0, 0, 0, 0, 0])?;
        let [wb, x, y, bias] = bindings.clone();
        let (g, eps) = a
            .norm
            .map_or_else(|| (x.clone(), 0.0), |(g, eps)| (g.clone(), eps));
        let push = push.f32(eps).u32(u32::from(a.norm.is_some()));
        let groups = Self::groups(chain, a.w.n_rows)?;
        chain.dispatch(&pl, &[wb, x, y, bias, g], &push, groups)?;
        let (bytes, flops) = product_cost(a);
        chain.set_cost(bytes, flops);
        Ok(())
    }

    /// Records the fused gate/up/activation of checked arguments (`push` as for
    /// [`MatvecDot::record`]; `up` the up weights' binding) that [`MatvecDot::fits`].
    pub(crate) fn record_glu(
        &self,
        chain: &mut Chain,
        a: &LinearGluArgs,
        bindings: [BufferSlice; 4],
        up: BufferSlice,
        push: Push,
    ) -> Result<()> {
        let pipelines = match a.gate.ty {
            GgmlType::Q5_K => &self.q5k_glu,
            _ => &self.q4k_glu,
        };
        let pl = pipelines.get(chain.context(), [WG, RPT, 0, 0, 0, 0, 0])?;
        let [wb, x, y, bias] = bindings;
        let (g, eps) = a
            .norm
            .map_or_else(|| (x.clone(), 0.0), |(g, eps)| (g.clone(), eps));
        let push = push
            .f32(eps)
            .u32(u32::from(a.norm.is_some()))
            .u32(a.op.code());
        let groups = Self::groups(chain, a.gate.n_rows)?;
        chain.dispatch(&pl, &[wb, x, y, bias, g, up], &push, groups)?;
        let (bytes, flops) = glu_cost(a);
        chain.set_cost(bytes, flops);
        Ok(())
    }
}

/// x (times `g`) quantized as the shader does: per block of 32 values `d = max|v| / 127`, codes
/// `round(v / d)` half away from zero (through `1 / d`, as the shader), returned dequantized
/// (`d * code`), with, per value, the step its code may move on the device: `d` where `v / d`
/// lies within `1e-4` of a rounding boundary (the device's division, a few ulps off, may round
/// it the other way), else 0.
pub fn q8_blocks(x: &[f32], g: Option<&[f32]>) -> (Vec<f64>, Vec<f64>) {
    let mut deq = Vec::with_capacity(x.len());
    let mut steps = Vec::with_capacity(x.len());
    for (b, xb) in x.chunks(QK).enumerate() {
        let v: Vec<f32> = xb
            .iter()
            .enumerate()
            .map(|(i, &xv)| g.map_or(xv, |g| xv * g[b * QK + i]))
            .collect();
        let amax = v.iter().fold(0f32, |m, a| m.max(a.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for &vv in &v {
            let s = vv * id;
            let code = s.signum() * (s.abs() + 0.5).floor();
            deq.push(f64::from(d) * f64::from(code));
            let near = ((s.abs() - s.abs().floor()) - 0.5).abs() < 1e-4;
            steps.push(if near { f64::from(d) } else { 0.0 });
        }
    }
    (deq, steps)
}

/// CPU reference of one row set of [`MatvecDot`] (`ty`: Q4_K, Q5_K or Q6_K rows):
/// `y[y_col + r] (= | +=) dot(W row r, q8(x)) (+ bias[r])`, times `1 / rms(x)` with the norm
/// `(g, eps)`; dots in f64 over the f32 weights
/// `octoflow_gguf` dequantizes. Returns, per row, the most the result may move where codes of x
/// lie at a rounding boundary ([`q8_blocks`]' steps times the weights).
#[allow(clippy::too_many_arguments)]
pub fn matvec_dot_ref(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    norm: Option<(&[f32], f32)>,
    y: &mut [f32],
    y_col: usize,
    bias: Option<&[f32]>,
    accumulate: bool,
) -> std::result::Result<Vec<f64>, QuantError> {
    let (xd, steps) = q8_blocks(&x[..n_cols], norm.map(|(g, _)| g));
    let inv = norm.map_or(1.0, |(_, eps)| {
        let ss: f64 = x[..n_cols]
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum();
        1.0 / (ss / n_cols as f64 + f64::from(eps)).sqrt()
    });
    let rb = octoflow_gguf::quant::quantized_size(ty, n_cols)?;
    let mut row = vec![0f32; n_cols];
    let mut slack = Vec::with_capacity(n_rows);
    for r in 0..n_rows {
        octoflow_gguf::quant::dequantize(ty, &w[r * rb..(r + 1) * rb], &mut row)?;
        let mut s: f64 = row.iter().zip(&xd).map(|(&a, &b)| f64::from(a) * b).sum();
        let loose: f64 = row
            .iter()
            .zip(&steps)
            .map(|(&w, &st)| f64::from(w.abs()) * st)
            .sum();
        s *= inv;
        if let Some(b) = bias {
            s += f64::from(b[r]);
        }
        let o = &mut y[y_col + r];
        if accumulate {
            s += f64::from(*o);
        }
        *o = s as f32;
        slack.push(loose * inv);
    }
    Ok(slack)
}

/// CPU reference of the GLU variant (`ty` Q4_K or Q5_K): gate and up as [`matvec_dot_ref`] (no
/// bias), then [`glu_ref`]. Returns each row's slack of gate and of up.
#[allow(clippy::too_many_arguments)]
pub fn matvec_dot_glu_ref(
    ty: GgmlType,
    gate: &[u8],
    up: &[u8],
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    norm: Option<(&[f32], f32)>,
    y: &mut [f32],
    op: GluOp,
) -> std::result::Result<Vec<(f64, f64)>, QuantError> {
    let (mut g, mut u) = (vec![0f32; n_rows], vec![0f32; n_rows]);
    let sg = matvec_dot_ref(ty, gate, n_rows, n_cols, x, norm, &mut g, 0, None, false)?;
    let su = matvec_dot_ref(ty, up, n_rows, n_cols, x, norm, &mut u, 0, None, false)?;
    glu_ref(&g, &u, &mut y[..n_rows], op);
    Ok(sg.into_iter().zip(su).collect())
}

#[cfg(test)]
#[path = "matvec_dot_tests.rs"]
mod tests;
