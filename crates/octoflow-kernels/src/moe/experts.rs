//! The expert products of a mixture of experts (shaders `moe_matvec.comp`, `moe_matmul.comp`):
//! for each (token, slot) pair `p`, the product with the rows of the expert it was routed to,
//! `y[p] = W_{ids[p]} · x[p / x_div] (+ bias)`, or with the GLU variants
//! `y[p] = act(W_gate x + b_gate, W_up x + b_up)`. A few tokens take the matvec, which reads
//! the expert id on the device and only that expert's rows (on 8-bit dot products where
//! [`MoeExperts::with_dot`] says so); batches take the grouped matmul over
//! [`super::MoeGroup`]'s lists, which reads each expert's rows once per tile of its pairs —
//! on cooperative matrices where the device has them and they are asked for
//! ([`MoeExperts::with_coop`], [`MoeExperts::uses_coop`]: the MOE
//! variants of `matmul_coop.comp`, whose products are of f16-rounded weights and inputs, as
//! [`moe_experts_coop_ref`] computes them) — or, for batches of at most
//! [`MoeExperts::with_dot_groups`] tokens, the grouped 8-bit dot products (`moe_dot.comp`'s
//! GROUPED variants: each expert's rows once per eight of its pairs).

use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Push};

use super::experts_dot::{DotKind, MoeDot, GROUP_PAIRS};
use super::MoeAct;
use crate::error::Result;
use crate::linear::linear_ref;
use crate::linear::matmul_coop::MatmulCoop;
use crate::linear::qweight::{row_bytes, type_index, word_slice, QOp, TYPES};
use crate::operand::{bad, need};
use crate::spec::SpecPipelines;

const OP: &str = "moe_experts";
/// Rows per matvec workgroup (`ROWS` in `moe_matvec.comp`).
const MATVEC_ROWS: u32 = 4;
/// Rows and pairs per grouped-matmul tile (`TM`, `TN` in `moe_matmul.comp`).
const MATMUL_TM: u32 = 64;
const MATMUL_TN: u32 = 64;
/// Rows and pairs per tile of the cooperative-matrix variants (`BM`, `BN` of the
/// `moe_matmul_coop_*` and `moe_matmul_coop_glu_*` lines of variants.txt).
const COOP_TILE: [u32; 2] = [128, 64];
const COOP_TILE_GLU: [u32; 2] = [64, 64];
/// The same for the wide variants (`moe_matmul_coop_wide_*`, `moe_matmul_coop_glu_wide_*`):
/// twice the pairs, so a group of up to 128 pairs decodes its expert's weights once.
const COOP_TILE_WIDE: [u32; 2] = [128, 128];
const COOP_TILE_GLU_WIDE: [u32; 2] = [64, 128];
/// The same for the narrow variants (`moe_matmul_coop_narrow_*`, `moe_matmul_coop_glu_narrow_*`):
/// 16 pairs, so a group of a few pairs (several streams' decode rows) does not pay for products
/// over a tile of 64.
const COOP_TILE_NARROW: [u32; 2] = [128, 16];
const COOP_TILE_GLU_NARROW: [u32; 2] = [64, 16];
/// The subgroup size the cooperative-matrix variants are laid out for.
const COOP_SUBGROUP: u32 = 32;
/// Push-constant bytes of every variant (12 words).
const PUSH_BYTES: u32 = 48;
/// Most pairs per token the COMBINE variants take (`MAX_USED` in `moe_matvec.comp`).
pub const COMBINE_MAX_USED: u32 = 8;

/// Some experts of a stacked GGUF tensor on the device (`[n_cols, n_rows, n_expert]` in GGUF
/// order): experts `e_begin .. e_begin + n_experts`, each `n_rows` rows of `n_cols` elements of
/// `ty`, expert after expert, row after row.
#[derive(Clone, Copy)]
pub struct ExpertWeights<'a> {
    pub ty: GgmlType,
    /// The experts' rows, `n_experts * n_rows * quantized_size(ty, n_cols)` bytes.
    pub data: &'a BufferSlice,
    pub e_begin: u32,
    pub n_experts: u32,
    /// Rows of one expert (output features).
    pub n_rows: u32,
    /// Input features (a multiple of the type's block size).
    pub n_cols: u32,
}

/// A batch's pairs grouped by expert ([`super::MoeGroup`]'s output).
#[derive(Clone, Copy)]
pub struct Groups<'a> {
    /// `[n_expert + 1]` u32.
    pub offsets: &'a BufferSlice,
    /// `[n_pairs]` u32.
    pub list: &'a BufferSlice,
    /// The most pairs one expert can hold (the batch's tokens: a token uses an expert once).
    pub max_group: u32,
}

/// The down products of a few tokens added straight into the residual stream (the COMBINE
/// variants of `moe_matvec.comp`): `x[t] += Σ_j weights[t, j] · y[t, j]`, j in increasing
/// order, as [`super::MoeCombine`] adds them, with no `y` written.
#[derive(Clone, Copy)]
pub struct Combine<'a> {
    /// `[n_pairs]` f32: each pair's routing weight.
    pub weights: &'a BufferSlice,
    /// `[n_pairs / n_used, n_rows]` f32: the residual stream.
    pub x: &'a BufferSlice,
    /// Pairs per token (at most [`COMBINE_MAX_USED`]).
    pub n_used: u32,
}

/// One expert product over every pair of a batch (see the module doc).
pub struct ExpertsArgs<'a> {
    /// The (gate) matrix.
    pub w: ExpertWeights<'a>,
    /// GLU: the up matrix (the gate's type, shape and experts) and the activation.
    pub glu: Option<(ExpertWeights<'a>, MoeAct)>,
    /// Every expert's bias, `[n_expert * n_rows]` f32 (GLU: both or neither).
    pub bias: Option<&'a BufferSlice>,
    /// GLU: the up matrix's bias, as `bias`.
    pub bias_up: Option<&'a BufferSlice>,
    /// Experts of the whole tensor (`w` may hold some of them).
    pub n_expert: u32,
    /// `[n_pairs / x_div, n_cols]` f32.
    pub x: &'a BufferSlice,
    /// Pairs per row of `x`: the experts per token where a token's slots share its input
    /// (gate, up), 1 where each pair has its own (down).
    pub x_div: u32,
    /// `[n_pairs, n_rows]` f32, apart from the inputs.
    pub y: &'a BufferSlice,
    /// `[n_pairs]` u32: each pair's expert.
    pub ids: &'a BufferSlice,
    pub n_pairs: u32,
    /// Grouped (the matmul) where given, else the matvec.
    pub groups: Option<Groups<'a>>,
    /// The matvec's products weighted and added to the stream instead of written to `y` (a
    /// plain product of one input row per pair over the whole tensor in one piece).
    pub combine: Option<Combine<'a>>,
    /// `x` already quantized per block of 32 in `quantize_q8.comp`'s layout (a row per row of
    /// `x`, [`crate::q8_words`]), as the fused router writes it: a GLU on the 8-bit dot kernel
    /// (a few tokens, not grouped; [`MoeExperts::with_xq`]) copies it instead of quantizing
    /// `x` in every workgroup; every other path reads `x`.
    pub xq: Option<&'a BufferSlice>,
}

/// The expert-product kernels, a matvec and a grouped matmul (and their GLU variants) per
/// weight type, each built on first use.
pub struct MoeExperts {
    matvec: Vec<SpecPipelines>,
    matvec_glu: Vec<SpecPipelines>,
    matvec_combine: Vec<SpecPipelines>,
    matmul: Vec<SpecPipelines>,
    matmul_glu: Vec<SpecPipelines>,
    matmul_coop: Vec<SpecPipelines>,
    matmul_coop_glu: Vec<SpecPipelines>,
    matmul_coop_wide: Vec<SpecPipelines>,
    matmul_coop_glu_wide: Vec<SpecPipelines>,
    matmul_coop_narrow: Vec<SpecPipelines>,
    matmul_coop_glu_narrow: Vec<SpecPipelines>,
    /// Grouped products take the cooperative-matrix variants where the device has them.
    coop: bool,
    /// ... the wide ones where the expert groups average at least this many pairs
    /// ([`MoeExperts::with_coop_wide`]).
    coop_wide_min: u32,
    /// ... the narrow ones where no group can have more than this many pairs
    /// ([`MoeExperts::with_coop_narrow`]).
    coop_narrow_max: u32,
    /// The matvec's products on 8-bit integer dot products where they fit
    /// ([`MoeExperts::with_dot`]).
    dot: Option<MoeDot>,
    /// Grouped products of batches of at most this many tokens take the dot kernel too
    /// ([`MoeExperts::with_dot_groups`]).
    dot_groups: u32,
    /// A few tokens' GLU products want their input quantized by the router
    /// ([`MoeExperts::with_xq`]).
    xq: bool,
}

impl Default for MoeExperts {
    fn default() -> Self {
        Self::new()
    }
}

impl MoeExperts {
    /// The kernels of every weight type (no pipeline is built until a record needs it).
    pub fn new() -> Self {
        let per = |op: QOp, bindings: u32| -> Vec<SpecPipelines> {
            (0..TYPES.len())
                .map(|i| {
                    let s = op.variant(i);
                    SpecPipelines::new(s, bindings, PUSH_BYTES, s.name)
                })
                .collect()
        };
        let coop = |op: QOp, bindings: u32| -> Vec<SpecPipelines> {
            per(op, bindings)
                .into_iter()
                .map(|s| s.full_subgroups(COOP_SUBGROUP))
                .collect()
        };
        MoeExperts {
            matvec: per(QOp::MoeMatvec, 5),
            matvec_glu: per(QOp::MoeMatvecGlu, 7),
            matvec_combine: per(QOp::MoeMatvecCombine, 6),
            matmul: per(QOp::MoeMatmul, 6),
            matmul_glu: per(QOp::MoeMatmulGlu, 8),
            matmul_coop: coop(QOp::MoeMatmulCoop, 6),
            matmul_coop_glu: coop(QOp::MoeMatmulCoopGlu, 8),
            matmul_coop_wide: coop(QOp::MoeMatmulCoopWide, 6),
            matmul_coop_glu_wide: coop(QOp::MoeMatmulCoopGluWide, 8),
            matmul_coop_narrow: coop(QOp::MoeMatmulCoopNarrow, 6),
            matmul_coop_glu_narrow: coop(QOp::MoeMatmulCoopGluNarrow, 8),
            coop_wide_min: u32::MAX,
            coop_narrow_max: 0,
            coop: false,
            dot: None,
            dot_groups: 0,
            xq: false,
        }
    }

    /// The same kernels, the matvec's products of the types `moe_dot.comp` reads on 8-bit
    /// integer dot products (`on`, where the device `caps` has them; [`crate::Tuning::moe_dot`]).
    pub fn with_dot(mut self, caps: &octoflow_vk::DeviceCaps, on: bool) -> Self {
        self.dot = if on { MoeDot::new(caps) } else { None };
        self
    }

    /// The same kernels with the 8-bit dot kernel's GLU (`glu`) or COMBINE pipelines of `ty`
    /// built from another variant of the shader (benchmarks compare them); `None` without it.
    #[cfg(all(test, feature = "bench"))]
    pub(crate) fn with_dot_variant(
        mut self,
        ty: GgmlType,
        glu: bool,
        sh: octoflow_vk::Shader,
    ) -> Option<Self> {
        self.dot = Some(self.dot.take()?.with_variant(ty, glu, sh));
        Some(self)
    }

    /// Whether the matvec's products of `ty`, `n_cols` wide, run on 8-bit dot products of x
    /// quantized per block of 32 (then their results are [`moe_experts_dot_ref`]'s).
    pub fn uses_dot(&self, ty: GgmlType, n_cols: u32) -> bool {
        self.dot
            .as_ref()
            .is_some_and(|d| d.fits(ty, DotKind::Plain, n_cols, 0, 0))
    }

    /// The same kernels, a few tokens' GLU products on the 8-bit dot products reading their
    /// input already quantized where the caller gives it ([`ExpertsArgs::xq`], `on`;
    /// [`crate::Tuning::moe_xq`]).
    pub fn with_xq(mut self, on: bool) -> Self {
        self.xq = on;
        self
    }

    /// Whether a few tokens' GLU products of `ty`, `n_cols` wide, take their input quantized
    /// ([`ExpertsArgs::xq`]): the fused router's caller then asks it for q8(h).
    pub fn takes_quantized(&self, ty: GgmlType, n_cols: u32) -> bool {
        self.xq
            && self
                .dot
                .as_ref()
                .is_some_and(|d| d.fits(ty, DotKind::GluQuantized, n_cols, 0, 0))
    }

    /// The same kernels, grouped products of batches of at most `max_tokens` tokens on the
    /// 8-bit dot products as well (with [`MoeExperts::with_dot`]; [`crate::Tuning::moe_dot_groups`]):
    /// each weight read once for up to eight pairs of its expert, where the grouped matmuls
    /// decode every weight of an expert to f16 for a tile of 64 pairs that a decode step's few
    /// pairs per expert leave nearly empty.
    pub fn with_dot_groups(mut self, max_tokens: u32) -> Self {
        self.dot_groups = max_tokens;
        self
    }

    /// Whether grouped products of `ty`, `n_cols` wide, for a batch of `max_group` tokens run
    /// on the 8-bit dot products (then their results are [`moe_experts_dot_ref`]'s).
    pub fn groups_use_dot(&self, ty: GgmlType, n_cols: u32, max_group: u32, glu: bool) -> bool {
        max_group <= self.dot_groups
            && self
                .dot
                .as_ref()
                .is_some_and(|d| d.fits(ty, DotKind::Grouped { glu }, n_cols, 0, 0))
    }

    /// The same kernels, grouped products on cooperative matrices where the device has them
    /// (`on`; [`crate::Tuning::moe_coop`]).
    pub fn with_coop(mut self, on: bool) -> Self {
        self.coop = on;
        self
    }

    /// The same kernels, grouped products on cooperative matrices in tiles of twice the pairs
    /// where the batch's pairs average at least `min_mean` an expert
    /// ([`crate::Tuning::moe_coop_wide_min`]; 0: always): a long prompt's groups of ~65–128
    /// pairs then decode each expert's weights once instead of twice, at the cost of products
    /// over the empty part of the tile, which is all they add where every group fits 64 pairs.
    /// The mean, not the largest possible group (the step's tokens), because only groups past
    /// 64 pairs gain.
    pub fn with_coop_wide(mut self, min_mean: u32) -> Self {
        self.coop_wide_min = min_mean;
        self
    }

    /// The same kernels, grouped products on cooperative matrices in tiles of 16 pairs where
    /// the largest group can have at most `max_group` pairs
    /// ([`crate::Tuning::moe_coop_narrow_max`]): several streams' decode steps, ~n_used /
    /// n_expert of their tokens an expert.
    pub fn with_coop_narrow(mut self, max_group: u32) -> Self {
        self.coop_narrow_max = max_group;
        self
    }

    /// Whether grouped products run on cooperative matrices on this device (then their results
    /// are [`moe_experts_coop_ref`]'s, not [`moe_experts_ref`]'s).
    pub fn uses_coop(&self, caps: &octoflow_vk::DeviceCaps) -> bool {
        self.coop && MatmulCoop::supported(caps)
    }

    /// Records the product `a` (see [`ExpertsArgs`]): one dispatch. Checks the type, the shapes,
    /// every operand's size and the grid against the device's limits.
    pub fn record(&self, chain: &mut Chain, a: &ExpertsArgs) -> Result<()> {
        let w = &a.w;
        let ti = type_index(OP, w.ty)?;
        let rb = row_bytes(OP, w.ty, w.n_cols)?;
        let shape = |d: String| bad(OP, d);
        if w.n_rows == 0 || w.n_experts == 0 || a.n_pairs == 0 || a.x_div == 0 {
            return Err(shape(format!(
                "empty product: {} rows, {} experts, {} pairs, x_div {}",
                w.n_rows, w.n_experts, a.n_pairs, a.x_div
            )));
        }
        if u64::from(w.e_begin) + u64::from(w.n_experts) > u64::from(a.n_expert) {
            return Err(shape(format!(
                "experts {}..{} of a tensor of {}",
                w.e_begin,
                w.e_begin + w.n_experts,
                a.n_expert
            )));
        }
        if !a.n_pairs.is_multiple_of(a.x_div) {
            return Err(shape(format!(
                "{} pairs are not whole rows of {} pairs",
                a.n_pairs, a.x_div
            )));
        }
        let bytes = u64::from(w.n_experts) * u64::from(w.n_rows) * u64::from(rb);
        let data = word_slice(OP, "weights", w.data, bytes)?;
        need(
            OP,
            "x",
            a.x,
            u128::from(a.n_pairs / a.x_div) * u128::from(w.n_cols),
        )?;
        if let Some(cb) = a.combine {
            if a.glu.is_some() || a.groups.is_some() || a.x_div != 1 {
                return Err(shape(
                    "the combined down product is a plain matvec of one input row per pair".into(),
                ));
            }
            if cb.n_used == 0
                || cb.n_used > COMBINE_MAX_USED
                || !a.n_pairs.is_multiple_of(cb.n_used)
            {
                return Err(shape(format!(
                    "{} pairs of {} per token: the combined product takes whole tokens of 1..={COMBINE_MAX_USED} pairs",
                    a.n_pairs, cb.n_used
                )));
            }
            if w.e_begin != 0 || w.n_experts != a.n_expert {
                return Err(shape(format!(
                    "the combined product binds experts {}..{} of {}: it needs the whole tensor",
                    w.e_begin,
                    w.e_begin + w.n_experts,
                    a.n_expert
                )));
            }
            need(OP, "weights", cb.weights, u128::from(a.n_pairs))?;
            need(
                OP,
                "stream",
                cb.x,
                u128::from(a.n_pairs / cb.n_used) * u128::from(w.n_rows),
            )?;
        } else {
            need(OP, "y", a.y, u128::from(a.n_pairs) * u128::from(w.n_rows))?;
        }
        need(OP, "ids", a.ids, u128::from(a.n_pairs))?;
        let bias_len = u128::from(a.n_expert) * u128::from(w.n_rows);
        for (name, b) in [("bias", a.bias), ("up bias", a.bias_up)] {
            if let Some(b) = b {
                need(OP, name, b, bias_len)?;
            }
        }
        let up = match a.glu {
            Some((u, _)) => {
                if (u.ty, u.e_begin, u.n_experts, u.n_rows, u.n_cols)
                    != (w.ty, w.e_begin, w.n_experts, w.n_rows, w.n_cols)
                {
                    return Err(shape(format!(
                        "GLU: up is {} {}x{} of experts {}+{}, gate {} {}x{} of {}+{}: both must match",
                        u.ty, u.n_rows, u.n_cols, u.e_begin, u.n_experts,
                        w.ty, w.n_rows, w.n_cols, w.e_begin, w.n_experts
                    )));
                }
                if a.bias.is_some() != a.bias_up.is_some() {
                    return Err(shape("GLU: gate and up biases come together".into()));
                }
                Some(word_slice(OP, "up weights", u.data, bytes)?)
            }
            None if a.bias_up.is_some() => {
                return Err(shape("an up bias without the GLU's up matrix".into()));
            }
            None => None,
        };
        let (act, alpha, limit) = a.glu.map_or((0, 0.0, 0.0), |(_, act)| act.push());
        let ctx = chain.context();
        let coop = a.groups.is_some() && self.uses_coop(ctx.caps());
        // the cooperative-matrix variants read x as vec4s where its rows are whole vec4s from a
        // 16-byte aligned start
        let x_vec = coop && w.n_cols.is_multiple_of(4) && a.x.offset.is_multiple_of(16);
        let push = Push::new()
            .u32(w.n_rows)
            .u32(w.n_cols)
            .u32(rb)
            .u32(a.n_pairs)
            .u32(a.x_div)
            .u32(w.e_begin)
            .u32(w.n_experts)
            .u32(u32::from(a.bias.is_some()) | (u32::from(x_vec) << 1))
            .u32(act)
            .f32(alpha)
            .f32(limit)
            .u32(a.combine.map_or(0, |cb| cb.n_used));
        // absent biases: x stands in for their bindings (never read)
        let bias = a.bias.unwrap_or(a.x).clone();
        let bias_up = a.bias_up.unwrap_or(a.x).clone();
        let y = a.combine.map_or(a.y, |cb| cb.x).clone();
        let mut bind = vec![data, a.x.clone(), y, bias];
        let max = ctx.caps().max_workgroup_count;
        let fits_grid = |groups: [u32; 3]| {
            if groups.iter().zip(max).any(|(&g, m)| g > m) {
                return Err(shape(format!(
                    "a grid of {groups:?} workgroups is over the device's {max:?}"
                )));
            }
            Ok(())
        };
        // the matvec's work on 8-bit dot products where they read it
        let kind = match (a.combine, up.is_some(), a.groups) {
            (Some(cb), ..) => DotKind::Combine(cb.n_used),
            (None, glu, Some(_)) => DotKind::Grouped { glu },
            (None, true, None) if self.xq && a.xq.is_some() => DotKind::GluQuantized,
            (None, true, None) => DotKind::Glu,
            (None, false, None) => DotKind::Plain,
        };
        let dot = self.dot.as_ref().filter(|d| {
            let up_offset = a.glu.map_or(0, |(u, _)| u.data.offset);
            a.groups.is_none_or(|g| g.max_group <= self.dot_groups)
                && d.fits(w.ty, kind, w.n_cols, a.x.offset, w.data.offset | up_offset)
        });
        // the grouped dot kernel's bindings: the GLU's up matrix and bias before the groups
        if let (Some(d), Some(g)) = (dot, a.groups) {
            need(OP, "offsets", g.offsets, u128::from(a.n_expert) + 1)?;
            need(OP, "list", g.list, u128::from(a.n_pairs))?;
            let runs = g.max_group.max(1).div_ceil(GROUP_PAIRS);
            let (pipeline, mut groups) = d.layout(ctx, w.ty, kind, w.n_rows, w.n_cols, runs)?;
            groups[2] = w.n_experts;
            fits_grid(groups)?;
            bind.push(a.ids.clone());
            if let Some(u) = up {
                bind.push(u);
                bind.push(bias_up);
            }
            bind.push(g.offsets.clone());
            bind.push(g.list.clone());
            // x quantized once for every workgroup of the product
            bind[1] = d.quantize(chain, a.x, a.n_pairs / a.x_div, w.n_cols)?;
            chain.dispatch(&pipeline, &bind, &push, groups)?;
            return Ok(());
        }
        let (pipeline, groups) = match (a.groups, a.combine) {
            (None, Some(cb)) => {
                bind.push(a.ids.clone());
                bind.push(cb.weights.clone());
                let tokens = a.n_pairs / cb.n_used;
                match dot {
                    Some(d) => d.layout(ctx, w.ty, kind, w.n_rows, w.n_cols, tokens)?,
                    None => {
                        let groups = [w.n_rows.div_ceil(MATVEC_ROWS), tokens, 1];
                        (self.matvec_combine[ti].get(ctx, [0; 7])?, groups)
                    }
                }
            }
            (None, None) => {
                bind.push(a.ids.clone());
                let set = if up.is_some() {
                    &self.matvec_glu
                } else {
                    &self.matvec
                };
                match dot {
                    Some(d) => d.layout(ctx, w.ty, kind, w.n_rows, w.n_cols, a.n_pairs)?,
                    None => {
                        let groups = [w.n_rows.div_ceil(MATVEC_ROWS), a.n_pairs, 1];
                        (set[ti].get(ctx, [0; 7])?, groups)
                    }
                }
            }
            (Some(g), _) => {
                need(OP, "offsets", g.offsets, u128::from(a.n_expert) + 1)?;
                need(OP, "list", g.list, u128::from(a.n_pairs))?;
                bind.push(g.offsets.clone());
                bind.push(g.list.clone());
                let wide = coop
                    && u64::from(a.n_pairs)
                        >= u64::from(self.coop_wide_min) * u64::from(a.n_expert);
                let narrow = coop && !wide && g.max_group <= self.coop_narrow_max;
                // the pipelines and their tile (rows, pairs)
                let (set, [tm, tn]) = match (coop, up.is_some()) {
                    (true, true) if wide => (&self.matmul_coop_glu_wide, COOP_TILE_GLU_WIDE),
                    (true, false) if wide => (&self.matmul_coop_wide, COOP_TILE_WIDE),
                    (true, true) if narrow => (&self.matmul_coop_glu_narrow, COOP_TILE_GLU_NARROW),
                    (true, false) if narrow => (&self.matmul_coop_narrow, COOP_TILE_NARROW),
                    (true, true) => (&self.matmul_coop_glu, COOP_TILE_GLU),
                    (true, false) => (&self.matmul_coop, COOP_TILE),
                    (false, true) => (&self.matmul_glu, [MATMUL_TM, MATMUL_TN]),
                    (false, false) => (&self.matmul, [MATMUL_TM, MATMUL_TN]),
                };
                let groups = [
                    w.n_rows.div_ceil(tm),
                    g.max_group.max(1).div_ceil(tn),
                    w.n_experts,
                ];
                (set[ti].get(ctx, [0; 7])?, groups)
            }
        };
        fits_grid(groups)?;
        if let Some(u) = up {
            bind.push(u);
            bind.push(bias_up);
        }
        if let (Some(_), DotKind::GluQuantized, Some(xq)) = (dot, kind, a.xq) {
            let rows = a.n_pairs / a.x_div;
            need(OP, "xq", xq, u128::from(crate::q8_words(rows, w.n_cols)))?;
            bind[1] = xq.clone();
        }
        chain.dispatch(&pipeline, &bind, &push, groups)?;
        Ok(())
    }
}

/// CPU reference of [`MoeExperts::record`] over a whole stacked tensor (`w`, and `up` for the
/// GLU, each `n_expert * n_rows` rows of `ty`): `y[p * n_rows + r]` for every pair `p` of
/// `ids`, each product dotted in f64 ([`linear_ref`]).
#[allow(clippy::too_many_arguments)]
pub fn moe_experts_ref(
    ty: GgmlType,
    w: &[u8],
    glu: Option<(&[u8], MoeAct)>,
    bias: Option<(&[f32], Option<&[f32]>)>,
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    x_div: usize,
    ids: &[u32],
) -> Result<Vec<f32>, octoflow_gguf::quant::QuantError> {
    let rb = octoflow_gguf::quant::quantized_size(ty, n_cols)?;
    let expert_bytes = n_rows * rb;
    let mut y = vec![0f32; ids.len() * n_rows];
    let mut up = vec![0f32; n_rows];
    for (p, (&e, yp)) in ids.iter().zip(y.chunks_exact_mut(n_rows)).enumerate() {
        let e = e as usize;
        let xp = &x[(p / x_div) * n_cols..(p / x_div + 1) * n_cols];
        let of = |b: &[u8]| b[e * expert_bytes..(e + 1) * expert_bytes].to_vec();
        let b_of = |b: &[f32]| b[e * n_rows..(e + 1) * n_rows].to_vec();
        let bias_g = bias.map(|(b, _)| b_of(b));
        linear_ref(
            ty,
            &of(w),
            n_rows,
            n_cols,
            xp,
            1,
            yp,
            n_rows,
            0,
            bias_g.as_deref(),
            false,
        )?;
        if let Some((uw, act)) = glu {
            let bias_u = bias.and_then(|(_, u)| u).map(b_of);
            linear_ref(
                ty,
                &of(uw),
                n_rows,
                n_cols,
                xp,
                1,
                &mut up,
                n_rows,
                0,
                bias_u.as_deref(),
                false,
            )?;
            for (g, &u) in yp.iter_mut().zip(&up) {
                *g = act.apply(*g, u);
            }
        }
    }
    Ok(y)
}

/// [`moe_experts_ref`] of the cooperative-matrix variants: the same products of the decoded
/// weights and the inputs each rounded to f16 first (summed in f64; the kernel sums in f32).
#[allow(clippy::too_many_arguments)]
pub fn moe_experts_coop_ref(
    ty: GgmlType,
    w: &[u8],
    glu: Option<(&[u8], MoeAct)>,
    bias: Option<(&[f32], Option<&[f32]>)>,
    n_rows: usize,
    n_cols: usize,
    x: &[f32],
    x_div: usize,
    ids: &[u32],
) -> Result<Vec<f32>, octoflow_gguf::quant::QuantError> {
    let rb = octoflow_gguf::quant::quantized_size(ty, n_cols)?;
    let to_f16 = |v: f32| half::f16::from_f32(v).to_f32();
    let f16_rows = |b: &[u8]| -> Result<Vec<u8>, octoflow_gguf::quant::QuantError> {
        let mut out = Vec::with_capacity(b.len() / rb * n_cols * 4);
        let mut row = vec![0f32; n_cols];
        for q in b.chunks_exact(rb) {
            octoflow_gguf::quant::dequantize(ty, q, &mut row)?;
            out.extend(row.iter().flat_map(|&v| to_f16(v).to_le_bytes()));
        }
        Ok(out)
    };
    let w16 = f16_rows(w)?;
    let up16 = match glu {
        Some((u, _)) => Some(f16_rows(u)?),
        None => None,
    };
    let x16: Vec<f32> = x.iter().map(|&v| to_f16(v)).collect();
    moe_experts_ref(
        GgmlType::F32,
        &w16,
        glu.zip(up16.as_deref()).map(|((_, act), u)| (u, act)),
        bias,
        n_rows,
        n_cols,
        &x16,
        x_div,
        ids,
    )
}
