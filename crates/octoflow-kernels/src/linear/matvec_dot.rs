//! One to [`MATVEC_MAX_TOKENS`] tokens of a product on 8-bit integer dot products
//! (`matvec_dot.comp`): x quantized per block of 32 values as llama.cpp's q8_1 inside each
//! workgroup, the weights' codes dotted with its codes four at a time, each weight decoded once
//! for all of a workgroup's tokens. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K, plain and
//! as the fused gate/up/activation. What [`super::Linear::record`] and
//! [`super::Linear::record_glu`] take where [`MatvecDot::takes`] and [`MatvecDot::fits`] say so;
//! [`matvec_dot_ref`] is its CPU reference.

use octoflow_gguf::quant::QuantError;
use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use super::args::{glu_cost, product_cost};
use super::{LinearArgs, LinearGluArgs, MATVEC_MAX_TOKENS, MATVEC_TPR, OP, PUSH_BYTES};
use crate::error::{KernelError, Result};
use crate::glu::{glu_ref, GluOp};
use crate::scratch::QueueScratch;
use crate::shaders;
use crate::spec::SpecPipelines;
use crate::tuning::{Tuning, FALLBACK_COMPUTE_UNITS};

/// Widest row the kernel takes (shared memory must also hold one token of it).
pub const MATVEC_DOT_MAX_COLS: u32 = 16384;
/// Invocations per workgroup (`WG`).
const WG: u32 = 256;
/// Rows a row group of 32 lanes takes at once (`RPT`): two, and four for batches over matrices
/// tall enough to give every compute unit two workgroups of 32 rows (each workgroup quantizes
/// the whole batch's x, which more rows a workgroup amortize).
const RPT: u32 = 2;
const RPT_TALL: u32 = 4;
/// Batches' products of at least this many rows (vocabulary projections) leave the kernel for
/// the cooperative-matrix one where the device has it ([`super::Linear`]).
pub(crate) const DOT_MAX_ROWS: u32 = 32768;
/// Values per quantized block of x.
const QK: usize = 32;
/// Push-constant bytes of quantize_q8.comp (n_tokens, n_cols, eps, norm).
const QUANTIZE_PUSH_BYTES: u32 = 16;

/// The types the kernel reads, in the order of [`MatvecDot`]'s pipelines.
const DOT_TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Where a product's 8-bit codes of x come from.
#[derive(Clone, Copy)]
pub(crate) enum DotInput<'a> {
    /// Each workgroup quantizes x.
    Workgroups,
    /// Quantized once for the product ([`MatvecDot::quantize_once`]).
    Once,
    /// Quantized once already, for several products of the same input.
    Quantized(&'a BufferSlice),
}

/// The shader's pipelines (plain and GLU per type of [`DOT_TYPES`]), for devices with integer
/// dot products.
pub(crate) struct MatvecDot {
    plain: Vec<SpecPipelines>,
    glu: Vec<SpecPipelines>,
    /// The XQ variants: x quantized once for the product by `quantize` into `xq`.
    plain_xq: Vec<SpecPipelines>,
    glu_xq: Vec<SpecPipelines>,
    quantize: Pipeline,
    xq: QueueScratch,
    layout: DotLayout,
}

/// What a product's work layout depends on beside its shape: the device's limits.
#[derive(Debug, Clone, Copy)]
struct DotLayout {
    /// The device's shared memory per workgroup: how many tokens a workgroup can take.
    max_shared: u32,
    /// The narrowest subgroup the pipelines run with (`SG`: the partial sums' room).
    subgroup: u32,
    /// The device's compute units (where it reports them): when a batch takes [`RPT_TALL`].
    units: u32,
}

impl MatvecDot {
    /// The pipelines (built on first use), with the subgroup size the matvec requires, or `None`
    /// where the device has no integer dot products.
    pub(crate) fn new(ctx: &Context, subgroup: Option<u32>) -> Result<Option<Self>> {
        use shaders::*;
        let caps = ctx.caps();
        let plain = [
            (MATVEC_DOT_Q4_0, "dot_q4_0"),
            (MATVEC_DOT_Q4_1, "dot_q4_1"),
            (MATVEC_DOT_Q5_0, "dot_q5_0"),
            (MATVEC_DOT_Q5_1, "dot_q5_1"),
            (MATVEC_DOT_Q8_0, "dot_q8_0"),
            (MATVEC_DOT_Q4_K, "dot_q4_k"),
            (MATVEC_DOT_Q5_K, "dot_q5_k"),
            (MATVEC_DOT_Q6_K, "dot_q6_k"),
        ];
        let glu = [
            (MATVEC_DOT_GLU_Q4_0, "dot_glu_q4_0"),
            (MATVEC_DOT_GLU_Q4_1, "dot_glu_q4_1"),
            (MATVEC_DOT_GLU_Q5_0, "dot_glu_q5_0"),
            (MATVEC_DOT_GLU_Q5_1, "dot_glu_q5_1"),
            (MATVEC_DOT_GLU_Q8_0, "dot_glu_q8_0"),
            (MATVEC_DOT_GLU_Q4_K, "dot_glu_q4_k"),
            (MATVEC_DOT_GLU_Q5_K, "dot_glu_q5_k"),
            (MATVEC_DOT_GLU_Q6_K, "dot_glu_q6_k"),
        ];
        let plain_xq = [
            (MATVEC_DOT_XQ_Q4_0, "dot_xq_q4_0"),
            (MATVEC_DOT_XQ_Q4_1, "dot_xq_q4_1"),
            (MATVEC_DOT_XQ_Q5_0, "dot_xq_q5_0"),
            (MATVEC_DOT_XQ_Q5_1, "dot_xq_q5_1"),
            (MATVEC_DOT_XQ_Q8_0, "dot_xq_q8_0"),
            (MATVEC_DOT_XQ_Q4_K, "dot_xq_q4_k"),
            (MATVEC_DOT_XQ_Q5_K, "dot_xq_q5_k"),
            (MATVEC_DOT_XQ_Q6_K, "dot_xq_q6_k"),
        ];
        let glu_xq = [
            (MATVEC_DOT_GLU_XQ_Q4_0, "dot_glu_xq_q4_0"),
            (MATVEC_DOT_GLU_XQ_Q4_1, "dot_glu_xq_q4_1"),
            (MATVEC_DOT_GLU_XQ_Q5_0, "dot_glu_xq_q5_0"),
            (MATVEC_DOT_GLU_XQ_Q5_1, "dot_glu_xq_q5_1"),
            (MATVEC_DOT_GLU_XQ_Q8_0, "dot_glu_xq_q8_0"),
            (MATVEC_DOT_GLU_XQ_Q4_K, "dot_glu_xq_q4_k"),
            (MATVEC_DOT_GLU_XQ_Q5_K, "dot_glu_xq_q5_k"),
            (MATVEC_DOT_GLU_XQ_Q6_K, "dot_glu_xq_q6_k"),
        ];
        let build = |list: &[(octoflow_vk::Shader, &'static str)], bindings, push| {
            list.iter()
                .map(|&(sh, label)| {
                    SpecPipelines::new(sh, bindings, push, label).subgroup_size(subgroup)
                })
                .collect()
        };
        if !caps.integer_dot_product {
            return Ok(None);
        }
        let quantize = Pipeline::new(
            ctx,
            &PipelineDesc::new(QUANTIZE_Q8, 3, QUANTIZE_PUSH_BYTES).label("quantize_q8"),
        )?;
        Ok(Some(MatvecDot {
            plain: build(&plain, 5, PUSH_BYTES + 8),
            glu: build(&glu, 6, PUSH_BYTES + 12),
            plain_xq: build(&plain_xq, 5, PUSH_BYTES + 8),
            glu_xq: build(&glu_xq, 6, PUSH_BYTES + 12),
            quantize,
            xq: QueueScratch::new("dot_xq"),
            layout: DotLayout {
                max_shared: caps.max_shared_memory,
                subgroup: subgroup.unwrap_or(caps.subgroup.min_size).max(1),
                units: caps.compute_units.unwrap_or(FALLBACK_COMPUTE_UNITS),
            },
        }))
    }

    /// The same pipelines with type `ty`'s plain (or GLU, `glu`) ones built from another
    /// variant of the shader (benchmarks compare them).
    #[cfg(all(test, feature = "bench"))]
    pub(crate) fn with_variant(mut self, ty: GgmlType, glu: bool, sh: octoflow_vk::Shader) -> Self {
        let ti = DOT_TYPES
            .iter()
            .position(|&t| t == ty)
            .expect("a type it reads");
        let (set, bindings, push) = if glu {
            (&mut self.glu, 6, PUSH_BYTES + 12)
        } else {
            (&mut self.plain, 5, PUSH_BYTES + 8)
        };
        let subgroup = set[ti].required_subgroup();
        set[ti] = SpecPipelines::new(sh, bindings, push, sh.name).subgroup_size(subgroup);
        self
    }

    /// Whether the tuning sends `n_tokens` tokens of a `ty` matrix of `weights` weights here
    /// (where they fit): one token of the K-quants with [`Tuning::matvec_dot`], and of every
    /// other type the kernel reads from [`Tuning::dot_min_weights`]; two to
    /// [`MATVEC_MAX_TOKENS`] of every type it reads where [`Tuning::dot_batches`] takes a step
    /// of `decode` rows.
    pub(crate) fn takes(
        tuning: &Tuning,
        ty: GgmlType,
        weights: u64,
        n_tokens: u32,
        decode: bool,
    ) -> bool {
        if n_tokens == 1 {
            let kq = matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K);
            let large = weights >= tuning.dot_min_weights && DOT_TYPES.contains(&ty);
            tuning.matvec_dot && (kq || large)
        } else {
            tuning.dot_batches.takes(decode) && DOT_TYPES.contains(&ty)
        }
    }

    /// Whether the kernel reads this product (`glu`: the fused gate/up): 1 ..=
    /// [`MATVEC_MAX_TOKENS`] tokens of a type it reads, rows of whole super-blocks (K-quants)
    /// or of an even number of blocks (the 2-byte aligned Q4_0, Q5_0 and Q8_0: whole words a
    /// row) or whole blocks (Q4_1, Q5_1), at most [`MATVEC_DOT_MAX_COLS`] wide and one token of
    /// them in shared memory, from 16-byte (K-quants) or 4-byte aligned offsets, no pending
    /// post-norm.
    pub(crate) fn fits(
        &self,
        ty: GgmlType,
        glu: bool,
        n_cols: u32,
        n_tokens: u32,
        pending: bool,
        w: &[&BufferSlice],
    ) -> bool {
        let (multiple, align) = match ty {
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => (256, 16),
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (64, 4),
            GgmlType::Q4_1 | GgmlType::Q5_1 => (32, 4),
            _ => return false,
        };
        (1..=MATVEC_MAX_TOKENS).contains(&n_tokens)
            && !pending
            && n_cols > 0
            && n_cols.is_multiple_of(multiple)
            && n_cols <= MATVEC_DOT_MAX_COLS
            && self.layout.shared_bytes(1, n_cols, glu, RPT_TALL) <= self.layout.max_shared
            && w.iter().all(|s| s.offset.is_multiple_of(align))
    }

    /// The pipeline and grid of a product that [`MatvecDot::fits`] (`xq`: the variant that
    /// reads x quantized once).
    #[allow(clippy::too_many_arguments)]
    fn layout(
        &self,
        chain: &Chain,
        ty: GgmlType,
        glu: bool,
        xq: bool,
        n_rows: u32,
        n_cols: u32,
        n_tokens: u32,
    ) -> Result<(octoflow_vk::Pipeline, [u32; 3])> {
        let ti = DOT_TYPES
            .iter()
            .position(|&t| t == ty)
            .ok_or_else(|| KernelError::Shape {
                op: OP,
                detail: format!("the integer-dot kernel does not read {ty}"),
            })?;
        let rpt = self.layout.rows_per_group(n_rows, n_tokens);
        let nt = self.layout.tokens_per_group(n_cols, n_tokens, glu, rpt);
        let set = match (glu, xq) {
            (false, false) => &self.plain,
            (true, false) => &self.glu,
            (false, true) => &self.plain_xq,
            (true, true) => &self.glu_xq,
        };
        let spec = [WG, rpt, nt, n_cols, self.layout.subgroup, 0, 0];
        let pl = set[ti].get(chain.context(), spec)?;
        let mut groups = chain
            .context()
            .groups_1d(u64::from(n_rows), WG / MATVEC_TPR * rpt)?;
        groups[2] = n_tokens.div_ceil(nt);
        Ok((pl, groups))
    }

    /// Where `once`, records x's quantization for the product (quantize_q8.comp, the norm `(g,
    /// eps)` applied where given) into this queue's scratch ([`record_quantize_q8`]) and
    /// returns the scratch, which the product then binds in place of x.
    pub(crate) fn quantize_once(
        &self,
        chain: &mut Chain,
        x: &BufferSlice,
        norm: Option<(&BufferSlice, f32)>,
        n_cols: u32,
        n_tokens: u32,
    ) -> Result<BufferSlice> {
        record_quantize_q8(chain, &self.quantize, &self.xq, x, norm, n_cols, n_tokens)
    }

    /// Records checked arguments (`push`: [`super::check_args`]' seven words; `bindings`: weights,
    /// x, y, bias) that [`MatvecDot::fits`], x's codes from `input` ([`Tuning::quantize_once`]).
    pub(crate) fn record(
        &self,
        chain: &mut Chain,
        a: &LinearArgs,
        bindings: &[BufferSlice; 4],
        push: Push,
        input: DotInput,
    ) -> Result<()> {
        let [wb, mut x, y, bias] = bindings.clone();
        let (n_rows, n_cols) = (a.w.n_rows, a.w.n_cols);
        let once = match input {
            DotInput::Workgroups => false,
            DotInput::Once => {
                x = self.quantize_once(chain, &x, a.norm, n_cols, a.n_tokens)?;
                true
            }
            DotInput::Quantized(q) => {
                x = q.clone();
                true
            }
        };
        let (pl, groups) = self.layout(chain, a.w.ty, false, once, n_rows, n_cols, a.n_tokens)?;
        let (g, eps) = a
            .norm
            .map_or_else(|| (x.clone(), 0.0), |(g, eps)| (g.clone(), eps));
        let push = push.f32(eps).u32(u32::from(a.norm.is_some()));
        chain.dispatch(&pl, &[wb, x, y, bias, g], &push, groups)?;
        let (bytes, flops) = product_cost(a);
        chain.set_cost(bytes, flops);
        Ok(())
    }

    /// Records the fused gate/up/activation of checked arguments (`push` as for
    /// [`MatvecDot::record`]; `up` the up weights' binding) that [`MatvecDot::fits`]; `once`
    /// as for [`MatvecDot::record`].
    pub(crate) fn record_glu(
        &self,
        chain: &mut Chain,
        a: &LinearGluArgs,
        bindings: [BufferSlice; 4],
        up: BufferSlice,
        push: Push,
        once: bool,
    ) -> Result<()> {
        let [wb, mut x, y, bias] = bindings;
        let (n_rows, n_cols) = (a.gate.n_rows, a.gate.n_cols);
        if once {
            x = self.quantize_once(chain, &x, a.norm, n_cols, a.n_tokens)?;
        }
        let (pl, groups) = self.layout(chain, a.gate.ty, true, once, n_rows, n_cols, a.n_tokens)?;
        let (g, eps) = a
            .norm
            .map_or_else(|| (x.clone(), 0.0), |(g, eps)| (g.clone(), eps));
        let push = push
            .f32(eps)
            .u32(u32::from(a.norm.is_some()))
            .u32(a.op.code());
        chain.dispatch(&pl, &[wb, x, y, bias, g, up], &push, groups)?;
        let (bytes, flops) = glu_cost(a);
        chain.set_cost(bytes, flops);
        Ok(())
    }
}

/// Records `n_rows` rows of `x` (`n_cols` wide, times the norm `(g, eps)` where given)
/// quantized per block of 32 by `quantize` (quantize_q8.comp) into `scratch` for `chain`'s
/// queue, between barriers — the one before keeps an earlier product's reads of that scratch
/// from meeting this write — and returns the scratch: the input of the products that read x
/// quantized once (`matvec_dot.comp`'s XQ variants, `moe_dot.comp`'s GROUPED ones).
/// Words of `n_rows` rows of `n_cols` (a multiple of 32) quantized per block of 32 in
/// `quantize_q8.comp`'s layout: the codes, each block's (d, d * sum of codes), a factor per row.
pub fn q8_words(n_rows: u32, n_cols: u32) -> u64 {
    u64::from(n_rows) * (u64::from(n_cols) / 4 + 2 * u64::from(n_cols / 32) + 1)
}

pub(crate) fn record_quantize_q8(
    chain: &mut Chain,
    quantize: &Pipeline,
    scratch: &QueueScratch,
    x: &BufferSlice,
    norm: Option<(&BufferSlice, f32)>,
    n_cols: u32,
    n_rows: u32,
) -> Result<BufferSlice> {
    let xq = scratch.get_slice(chain, 4 * q8_words(n_rows, n_cols))?;
    // no norm: x stands in for its weight (never read)
    let (g, eps) = norm.map_or_else(|| (x.clone(), 0.0), |(g, eps)| (g.clone(), eps));
    let push = Push::new()
        .u32(n_rows)
        .u32(n_cols)
        .f32(eps)
        .u32(u32::from(norm.is_some()));
    chain.compute_barrier()?;
    chain.dispatch(quantize, &[x.clone(), g, xq.clone()], &push, [n_rows, 1, 1])?;
    chain.compute_barrier()?;
    Ok(xq)
}

impl DotLayout {
    /// Tokens per workgroup for `n_tokens` tokens of `n_cols`-wide rows: as many as shared
    /// memory holds, evened out over the workgroups' token ranges.
    fn tokens_per_group(&self, n_cols: u32, n_tokens: u32, glu: bool, rpt: u32) -> u32 {
        let fit = (1..=n_tokens)
            .rev()
            .find(|&nt| self.shared_bytes(nt, n_cols, glu, rpt) <= self.max_shared)
            .unwrap_or(1);
        n_tokens.div_ceil(n_tokens.div_ceil(fit))
    }

    /// Rows a row group takes for `n_tokens` tokens of an `n_rows`-row matrix.
    fn rows_per_group(&self, n_rows: u32, n_tokens: u32) -> u32 {
        let tall = u64::from(n_rows) >= 2 * u64::from(WG / MATVEC_TPR * RPT_TALL * self.units);
        if n_tokens > 1 && tall {
            RPT_TALL
        } else {
            RPT
        }
    }

    /// Shared-memory bytes of a workgroup taking `nt` tokens of `n_cols`-wide rows, `rpt` rows
    /// a row group (the shader's `xq`, `xs`, `xn`, `invs` and `part`).
    fn shared_bytes(&self, nt: u32, n_cols: u32, glu: bool, rpt: u32) -> u32 {
        let nm = if glu { 2 } else { 1 };
        let blocks = n_cols / 32;
        nt * n_cols + nt * blocks * 12 + nt * 4 + WG / self.subgroup * nm * rpt * nt * 4
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

/// Rows of `x` (`n_cols` wide, a multiple of 32) in `quantize_q8.comp`'s layout without a norm
/// ([`q8_words`]): the codes [`q8_blocks`] rounds to, per block (d, d * sum of the codes) as the
/// shader computes them, and a factor 1 per row — what the products' XQ variants copy.
pub fn quantize_q8_ref(x: &[f32], n_cols: usize) -> Vec<u32> {
    let n = x.len() / n_cols;
    let nb = n_cols / QK;
    let mut words = vec![0u32; q8_words(n as u32, n_cols as u32) as usize];
    let sbase = n * n_cols / 4;
    for (b, xb) in x.chunks(QK).enumerate() {
        let amax = xb.iter().fold(0f32, |m, a| m.max(a.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (j, &v) in xb.iter().enumerate() {
            let s = v * id;
            let code = (s.signum() * (s.abs() + 0.5).floor()) as i32;
            sum += code;
            let c = b * QK + j;
            words[c / 4] |= u32::from(code as i8 as u8) << (8 * (c % 4));
        }
        words[sbase + 2 * b] = d.to_bits();
        words[sbase + 2 * b + 1] = (d * sum as f32).to_bits();
    }
    for t in 0..n {
        words[sbase + 2 * n * nb + t] = 1f32.to_bits();
    }
    words
}

/// CPU reference of one token of [`MatvecDot`] (`ty`: a type it reads):
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

/// CPU reference of one token of the GLU variant: gate and up as [`matvec_dot_ref`] (no
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
