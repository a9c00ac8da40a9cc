//! The few-token expert products on 8-bit integer dot products (`moe_dot.comp`): what
//! [`super::MoeExperts::record`] takes for the matvec's work (plain, GLU and the combined down
//! products) where [`MoeDot::fits`] says so — Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4 and the
//! K-quants Q4_K, Q5_K, Q6_K — each pair's input quantized per block of 32 as llama.cpp's q8_1 (as
//! [`crate::linear::q8_blocks`] computes it). [`moe_experts_dot_ref`] is its CPU reference.

use octoflow_gguf::quant::QuantError;
use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Context, DeviceCaps, Pipeline};

use super::MoeAct;
use crate::error::Result;
use crate::linear::matvec_dot_ref;
use crate::linear::record_quantize_q8;
use crate::operand::bad;
use crate::scratch::QueueScratch;
use crate::shaders;
use crate::spec::SpecPipelines;
use crate::tuning::FALLBACK_COMPUTE_UNITS;

const OP: &str = "moe_experts";
/// Invocations per workgroup (`WG`), lanes a row group (`TPR`).
const WG: u32 = 256;
const TPR: u32 = 32;
/// Widest row the kernel takes.
const MAX_COLS: u32 = 16384;
/// Push-constant bytes (as `moe_matvec.comp`'s 12 words).
const PUSH_BYTES: u32 = 48;
/// Push-constant bytes of quantize_q8.comp (n_tokens, n_cols, eps, norm).
const QUANTIZE_PUSH_BYTES: u32 = 16;

/// The types the kernel reads, in the order of [`MoeDot`]'s pipelines.
const DOT_TYPES: [GgmlType; 9] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::MXFP4,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Which of the kernel's variants a product takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum DotKind {
    Plain,
    Glu,
    /// The GLU on x already quantized ([`super::ExpertsArgs::xq`]).
    GluQuantized,
    /// The down products of tokens of this many pairs, added into the stream.
    Combine(u32),
    /// A batch's pairs grouped by expert, runs of up to [`GROUP_PAIRS`] pairs of one expert a
    /// workgroup (the GLU or not).
    Grouped {
        glu: bool,
    },
}

/// Pairs of one expert a grouped workgroup takes (the shader's `NU`): each weight read once
/// for up to this many.
pub(crate) const GROUP_PAIRS: u32 = 8;

/// The shader's pipelines per type of [`DOT_TYPES`], for devices with integer dot products.
pub(crate) struct MoeDot {
    plain: Vec<SpecPipelines>,
    glu: Vec<SpecPipelines>,
    glu_xq: Vec<SpecPipelines>,
    combine: Vec<SpecPipelines>,
    grouped: Vec<SpecPipelines>,
    grouped_glu: Vec<SpecPipelines>,
    /// x quantized once for the grouped variants (`quantize_q8.comp`), into `xq`.
    quantize: SpecPipelines,
    xq: QueueScratch,
    /// The narrowest subgroup the pipelines run with (`SG`).
    subgroup: u32,
    max_shared: u32,
    units: u32,
}

impl MoeDot {
    /// The pipelines (built on first use), or `None` where the device has no integer dot
    /// products or no subgroup size dividing 32.
    pub(crate) fn new(caps: &DeviceCaps) -> Option<Self> {
        use shaders::*;
        let sg = &caps.subgroup;
        let required = if sg.max_size > TPR || !TPR.is_multiple_of(sg.size.max(1)) {
            if !(sg.size_control && sg.min_size <= TPR) {
                return None;
            }
            Some(TPR)
        } else {
            None
        };
        let build = |list: [(octoflow_vk::Shader, &'static str); 9], bindings| {
            list.iter()
                .map(|&(sh, label)| {
                    SpecPipelines::new(sh, bindings, PUSH_BYTES, label).subgroup_size(required)
                })
                .collect()
        };
        caps.integer_dot_product.then(|| MoeDot {
            plain: build(
                [
                    (MOE_DOT_Q4_0, "moe_dot_q4_0"),
                    (MOE_DOT_Q4_1, "moe_dot_q4_1"),
                    (MOE_DOT_Q5_0, "moe_dot_q5_0"),
                    (MOE_DOT_Q5_1, "moe_dot_q5_1"),
                    (MOE_DOT_Q8_0, "moe_dot_q8_0"),
                    (MOE_DOT_MXFP4, "moe_dot_mxfp4"),
                    (MOE_DOT_Q4_K, "moe_dot_q4_k"),
                    (MOE_DOT_Q5_K, "moe_dot_q5_k"),
                    (MOE_DOT_Q6_K, "moe_dot_q6_k"),
                ],
                5,
            ),
            glu: build(
                [
                    (MOE_DOT_GLU_Q4_0, "moe_dot_glu_q4_0"),
                    (MOE_DOT_GLU_Q4_1, "moe_dot_glu_q4_1"),
                    (MOE_DOT_GLU_Q5_0, "moe_dot_glu_q5_0"),
                    (MOE_DOT_GLU_Q5_1, "moe_dot_glu_q5_1"),
                    (MOE_DOT_GLU_Q8_0, "moe_dot_glu_q8_0"),
                    (MOE_DOT_GLU_MXFP4, "moe_dot_glu_mxfp4"),
                    (MOE_DOT_GLU_Q4_K, "moe_dot_glu_q4_k"),
                    (MOE_DOT_GLU_Q5_K, "moe_dot_glu_q5_k"),
                    (MOE_DOT_GLU_Q6_K, "moe_dot_glu_q6_k"),
                ],
                7,
            ),
            glu_xq: build(
                [
                    (MOE_DOT_GLU_XQ_Q4_0, "moe_dot_glu_xq_q4_0"),
                    (MOE_DOT_GLU_XQ_Q4_1, "moe_dot_glu_xq_q4_1"),
                    (MOE_DOT_GLU_XQ_Q5_0, "moe_dot_glu_xq_q5_0"),
                    (MOE_DOT_GLU_XQ_Q5_1, "moe_dot_glu_xq_q5_1"),
                    (MOE_DOT_GLU_XQ_Q8_0, "moe_dot_glu_xq_q8_0"),
                    (MOE_DOT_GLU_XQ_MXFP4, "moe_dot_glu_xq_mxfp4"),
                    (MOE_DOT_GLU_XQ_Q4_K, "moe_dot_glu_xq_q4_k"),
                    (MOE_DOT_GLU_XQ_Q5_K, "moe_dot_glu_xq_q5_k"),
                    (MOE_DOT_GLU_XQ_Q6_K, "moe_dot_glu_xq_q6_k"),
                ],
                7,
            ),
            combine: build(
                [
                    (MOE_DOT_COMBINE_Q4_0, "moe_dot_combine_q4_0"),
                    (MOE_DOT_COMBINE_Q4_1, "moe_dot_combine_q4_1"),
                    (MOE_DOT_COMBINE_Q5_0, "moe_dot_combine_q5_0"),
                    (MOE_DOT_COMBINE_Q5_1, "moe_dot_combine_q5_1"),
                    (MOE_DOT_COMBINE_Q8_0, "moe_dot_combine_q8_0"),
                    (MOE_DOT_COMBINE_MXFP4, "moe_dot_combine_mxfp4"),
                    (MOE_DOT_COMBINE_Q4_K, "moe_dot_combine_q4_k"),
                    (MOE_DOT_COMBINE_Q5_K, "moe_dot_combine_q5_k"),
                    (MOE_DOT_COMBINE_Q6_K, "moe_dot_combine_q6_k"),
                ],
                6,
            ),
            grouped: build(
                [
                    (MOE_DOT_GROUPED_Q4_0, "moe_dot_grouped_q4_0"),
                    (MOE_DOT_GROUPED_Q4_1, "moe_dot_grouped_q4_1"),
                    (MOE_DOT_GROUPED_Q5_0, "moe_dot_grouped_q5_0"),
                    (MOE_DOT_GROUPED_Q5_1, "moe_dot_grouped_q5_1"),
                    (MOE_DOT_GROUPED_Q8_0, "moe_dot_grouped_q8_0"),
                    (MOE_DOT_GROUPED_MXFP4, "moe_dot_grouped_mxfp4"),
                    (MOE_DOT_GROUPED_Q4_K, "moe_dot_grouped_q4_k"),
                    (MOE_DOT_GROUPED_Q5_K, "moe_dot_grouped_q5_k"),
                    (MOE_DOT_GROUPED_Q6_K, "moe_dot_grouped_q6_k"),
                ],
                7,
            ),
            grouped_glu: build(
                [
                    (MOE_DOT_GROUPED_GLU_Q4_0, "moe_dot_grouped_glu_q4_0"),
                    (MOE_DOT_GROUPED_GLU_Q4_1, "moe_dot_grouped_glu_q4_1"),
                    (MOE_DOT_GROUPED_GLU_Q5_0, "moe_dot_grouped_glu_q5_0"),
                    (MOE_DOT_GROUPED_GLU_Q5_1, "moe_dot_grouped_glu_q5_1"),
                    (MOE_DOT_GROUPED_GLU_Q8_0, "moe_dot_grouped_glu_q8_0"),
                    (MOE_DOT_GROUPED_GLU_MXFP4, "moe_dot_grouped_glu_mxfp4"),
                    (MOE_DOT_GROUPED_GLU_Q4_K, "moe_dot_grouped_glu_q4_k"),
                    (MOE_DOT_GROUPED_GLU_Q5_K, "moe_dot_grouped_glu_q5_k"),
                    (MOE_DOT_GROUPED_GLU_Q6_K, "moe_dot_grouped_glu_q6_k"),
                ],
                9,
            ),
            quantize: SpecPipelines::new(QUANTIZE_Q8, 3, QUANTIZE_PUSH_BYTES, "quantize_q8"),
            xq: QueueScratch::new("moe_dot_xq"),
            subgroup: required.unwrap_or(sg.min_size).max(1),
            max_shared: caps.max_shared_memory,
            units: caps.compute_units.unwrap_or(FALLBACK_COMPUTE_UNITS),
        })
    }

    /// The same pipelines with type `ty`'s GLU (`glu`) or COMBINE ones built from another
    /// variant of the shader (benchmarks compare them).
    #[cfg(all(test, feature = "bench"))]
    pub(crate) fn with_variant(mut self, ty: GgmlType, glu: bool, sh: octoflow_vk::Shader) -> Self {
        let ti = DOT_TYPES
            .iter()
            .position(|&t| t == ty)
            .expect("a type it reads");
        let (set, bindings) = if glu {
            (&mut self.glu, 7)
        } else {
            (&mut self.combine, 6)
        };
        let subgroup = set[ti].required_subgroup();
        set[ti] = SpecPipelines::new(sh, bindings, PUSH_BYTES, sh.name).subgroup_size(subgroup);
        self
    }

    /// Whether the kernel reads this product: a type it reads, rows of whole blocks (an even
    /// number of them for the 2-byte aligned Q4_0, Q5_0 and Q8_0: whole words a row; whole
    /// super-blocks for the K-quants) at most [`MAX_COLS`] wide whose pairs' inputs fit shared
    /// memory, x (`x_offset`) and Q4_K/Q5_K weights (`w_offset`, read as 16-byte vectors) at
    /// 16-byte aligned offsets.
    pub(crate) fn fits(
        &self,
        ty: GgmlType,
        kind: DotKind,
        n_cols: u32,
        x_offset: u64,
        w_offset: u64,
    ) -> bool {
        let (multiple, w_align) = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (64, 4),
            GgmlType::Q4_K | GgmlType::Q5_K => (256, 16),
            GgmlType::Q6_K => (256, 4),
            t if DOT_TYPES.contains(&t) => (32, 4),
            _ => return false,
        };
        n_cols > 0
            && n_cols.is_multiple_of(multiple)
            && n_cols <= MAX_COLS
            && x_offset.is_multiple_of(16)
            && w_offset.is_multiple_of(w_align)
            && self.shared_bytes(kind, n_cols, 2) <= self.max_shared
    }

    /// Shared-memory bytes of a workgroup of `rpt` rows a row group (the shader's `xq`, `xs`
    /// and `part`).
    fn shared_bytes(&self, kind: DotKind, n_cols: u32, rpt: u32) -> u32 {
        let (nm, nu) = match kind {
            DotKind::Plain => (1, 1),
            DotKind::Glu | DotKind::GluQuantized => (2, 1),
            DotKind::Combine(n) => (1, n),
            DotKind::Grouped { glu } => (if glu { 2 } else { 1 }, GROUP_PAIRS),
        };
        nu * n_cols + nu * (n_cols / 32) * 8 + WG / self.subgroup * nm * rpt * nu * 4
    }

    /// Records the `n_rows` rows of `x` (`n_cols` wide) quantized per block of 32 into this
    /// queue's scratch ([`record_quantize_q8`]) and returns it: the input of a
    /// [`DotKind::Grouped`] product (bound in place of x).
    pub(crate) fn quantize(
        &self,
        chain: &mut Chain,
        x: &BufferSlice,
        n_rows: u32,
        n_cols: u32,
    ) -> Result<BufferSlice> {
        let pipeline = self.quantize.get(chain.context(), [0; 7])?;
        record_quantize_q8(chain, &pipeline, &self.xq, x, None, n_cols, n_rows)
    }

    /// The pipeline and grid of a product that [`MoeDot::fits`]: `n_rows` rows of each
    /// expert, `n_groups` workgroup rows (pairs, tokens for [`DotKind::Combine`], runs of a
    /// group for [`DotKind::Grouped`], whose caller sets the grid's experts). Two rows a row
    /// group, one where that would leave fewer than two workgroups per compute unit.
    pub(crate) fn layout(
        &self,
        ctx: &Context,
        ty: GgmlType,
        kind: DotKind,
        n_rows: u32,
        n_cols: u32,
        n_groups: u32,
    ) -> Result<(Pipeline, [u32; 3])> {
        let ti = DOT_TYPES
            .iter()
            .position(|&t| t == ty)
            .ok_or_else(|| bad(OP, format!("the integer-dot kernel does not read {ty}")))?;
        let rows_per_group = |rpt: u32| n_rows.div_ceil(WG / TPR * rpt);
        let rpt = if u64::from(rows_per_group(2)) * u64::from(n_groups) >= 2 * u64::from(self.units)
        {
            2
        } else {
            1
        };
        let (set, nu) = match kind {
            DotKind::Plain => (&self.plain, 1),
            DotKind::Glu => (&self.glu, 1),
            DotKind::GluQuantized => (&self.glu_xq, 1),
            DotKind::Combine(n) => (&self.combine, n),
            DotKind::Grouped { glu: false } => (&self.grouped, GROUP_PAIRS),
            DotKind::Grouped { glu: true } => (&self.grouped_glu, GROUP_PAIRS),
        };
        let spec = [WG, rpt, nu, n_cols, self.subgroup, 0, 0];
        let pl = set[ti].get(ctx, spec)?;
        Ok((pl, [rows_per_group(rpt), n_groups, 1]))
    }
}

/// CPU reference of the kernel over a whole stacked tensor (as [`super::moe_experts_ref`]'s
/// arguments; every pair's input quantized as the kernel does, [`matvec_dot_ref`]). Returns
/// `y[p * n_rows + r]` and, per output, the most it may move where codes of x lie at a rounding
/// boundary.
#[allow(clippy::too_many_arguments)]
pub fn moe_experts_dot_ref(
    ty: GgmlType,
    w: &[u8],
    glu: Option<(&[u8], MoeAct)>,
    bias: Option<(&[f32], Option<&[f32]>)>,
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    x_div: usize,
    ids: &[u32],
) -> std::result::Result<(Vec<f32>, Vec<f64>), QuantError> {
    let rb = octoflow_gguf::quant::quantized_size(ty, n_cols)?;
    let eb = n_rows * rb;
    let mut y = vec![0f32; ids.len() * n_rows];
    let mut slack = vec![0f64; ids.len() * n_rows];
    let (mut g, mut u) = (vec![0f32; n_rows], vec![0f32; n_rows]);
    for (p, &e) in ids.iter().enumerate() {
        let e = e as usize;
        let xp = &x[(p / x_div) * n_cols..(p / x_div + 1) * n_cols];
        let expert = |m: &[u8]| m[e * eb..(e + 1) * eb].to_vec();
        let bias_of = |b: &[f32]| b[e * n_rows..(e + 1) * n_rows].to_vec();
        let bg = bias.map(|(b, _)| bias_of(b));
        let sg = matvec_dot_ref(
            ty,
            &expert(w),
            n_rows,
            n_cols,
            xp,
            None,
            &mut g,
            0,
            bg.as_deref(),
            false,
        )?;
        let (yp, sp) = (
            &mut y[p * n_rows..(p + 1) * n_rows],
            &mut slack[p * n_rows..(p + 1) * n_rows],
        );
        match glu {
            None => {
                yp.copy_from_slice(&g);
                sp.copy_from_slice(&sg);
            }
            Some((uw, act)) => {
                let bu = bias.and_then(|(_, b)| b).map(bias_of);
                let su = matvec_dot_ref(
                    ty,
                    &expert(uw),
                    n_rows,
                    n_cols,
                    xp,
                    None,
                    &mut u,
                    0,
                    bu.as_deref(),
                    false,
                )?;
                for r in 0..n_rows {
                    yp[r] = act.apply(g[r], u[r]);
                    // a gate or up moved by its slack moves the activation by at most about
                    // this much (both activations' slopes stay near 1 in the gate, and are
                    // the gated value in the up)
                    let (gv, uv) = (f64::from(g[r]).abs(), f64::from(u[r]).abs());
                    sp[r] = 1.2 * sg[r] * (uv + 1.0) + (gv + sg[r]) * su[r];
                }
            }
        }
    }
    Ok((y, slack))
}
