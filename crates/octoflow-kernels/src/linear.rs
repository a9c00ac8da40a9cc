//! Linear layers on GGUF-encoded weights: `y[t, y_col + r] (=|+=) dot(W row r, x[t]) (+ bias[r])`
//! (shaders `matvec.comp` for a few tokens, `matmul.comp` for batches, or `matmul_coop.comp` on
//! devices with cooperative matrices — see [`crate::matmul_coop`]; weight decoding in
//! `quant.glsl`).
//!
//! Weights stay on the device in their exact GGUF bytes: `n_rows` rows of `n_cols` elements,
//! row `r` at byte `r * row_bytes` with `row_bytes = quantized_size(ty, n_cols)`. Types: F32,
//! F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.
//!
//! On CPU drivers (lavapipe) both products use `linear_cpu.comp` instead, a layout without
//! shared memory whose x reads are subgroup-uniform (see the shader's header).
//!
//! [`Linear::record_glu`] fuses an FFN's gated linear unit for a few tokens: both products of
//! the gate and up matrices and `act(gate) * up` in one dispatch (the `GLU` variants of
//! `matvec.comp` and `linear_cpu.comp`), one barrier stage and two dispatches fewer per layer
//! than two matvecs, a barrier and [`crate::Glu`].

use octoflow_gguf::quant::QuantError;
use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Context, DeviceKind, Pipeline, PipelineDesc, Push, VkError};

use crate::error::{KernelError, Result};
use crate::glu::{glu_ref, GluOp};
use crate::matmul_coop::MatmulCoop;
use crate::operand::overlap;
use crate::qweight::{check_words, row_bytes, type_index, variant, word_slice, QOp, TYPES};
use crate::spec::SpecPipelines;

const OP: &str = "linear";

/// Batches of at most this many tokens use the matrix-vector kernel (`MAXT` in `matvec.comp`);
/// larger ones the tiled matrix-matrix kernel.
pub const MATVEC_MAX_TOKENS: u32 = 8;
/// The narrowest matvec row (`TPR` in `matvec.comp`, invocations per row): every layout's
/// `TPR` is a multiple of it, so a subgroup size dividing it divides them all.
const MATVEC_TPR: u32 = 32;
/// Rows and tokens per matmul workgroup tile (`TM`, `TN` in `matmul.comp`).
const MATMUL_TM: u32 = 64;
const MATMUL_TN: u32 = 64;
/// Rows per workgroup of the CPU-driver kernels (`WG * R` in `linear_cpu.comp`).
const CPU_ROWS: u32 = 128;
/// The subgroup size `linear_cpu.comp` is written for (`SG`).
const CPU_SUBGROUP: u32 = 8;
/// Tokens per workgroup of the CPU-driver matvec and matmul variants (`TN` in `variants.txt`).
const CPU_MATVEC_TN: u32 = 4;
const CPU_MATMUL_TN: u32 = 8;
/// Push-constant bytes of every linear shader (7 u32).
pub(crate) const PUSH_BYTES: u32 = 28;
/// Push-constant bytes of the GLU variants: those 7, eps, norm and the activation.
const GLU_PUSH_BYTES: u32 = PUSH_BYTES + 12;
/// Storage-buffer bindings of the CPU-driver GLU variants: weights, x, y, bias (unused), norm
/// weight, up weights.
const GLU_BINDINGS: u32 = 6;
/// Storage-buffer bindings of the GPU matvec: weights, x, y, bias, norm weight, then the pending
/// post-norm's input, weight and settled output ([`PendingNorm`]); the GLU variant has the up
/// weights before those three.
const MATVEC_BINDINGS: u32 = 8;
/// Push-constant bytes of the GPU matvec: the 7 words, eps, norm and the pending flags; the GLU
/// variant adds the activation before the flags.
const MATVEC_PUSH_BYTES: u32 = PUSH_BYTES + 12;
/// Batches of at least this many tokens use the cooperative-matrix kernel where the device has
/// it (its products are of f16-rounded operands: see [`crate::matmul_coop`]); smaller ones the
/// matvec kernel, and on devices without cooperative matrices every batch of up to
/// [`MATVEC_MAX_TOKENS`]. On the H100 (qwen2.5-0.5B, `octoflow bench --streams`, whole decode
/// steps) the cooperative-matrix step stays near 2.9 ms from 3 to 32 rows (its tiles pad to 64
/// tokens), while the matvec kernel's grows with its tokens: 1.26 / 1.77 / 2.38 ms for 1 / 2 / 4
/// (x staged in shared memory), 6.1 ms for 8 (read from global memory per row).
pub const COOP_MIN_TOKENS: u32 = 5;

/// [`COOP_MIN_TOKENS`], or `OCTOFLOW_COOP_MIN_TOKENS` (2 ..= 9) where set: a switch to
/// measure where the two kernels cross (tests assume the default).
fn coop_min_tokens() -> u32 {
    static MIN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("OCTOFLOW_COOP_MIN_TOKENS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| (2..=MATVEC_MAX_TOKENS + 1).contains(n))
            .unwrap_or(COOP_MIN_TOKENS)
    })
}

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

/// The linear-layer kernels, a matvec and a matmul pipeline per weight type (and the
/// cooperative-matrix matmul where the device has it), built once.
pub struct Linear {
    /// The matvec and fused-GLU matvec per weight type: specialized per work layout
    /// ([`MatvecPlan`]) on the GPU layout, one pipeline each on the CPU layout.
    matvec: Vec<Matvec>,
    matvec_glu: Vec<Matvec>,
    matmul: Vec<Pipeline>,
    /// The pipelines are the `linear_cpu.comp` variants.
    cpu: bool,
    /// Batches of [`COOP_MIN_TOKENS`] or more go here when present.
    coop: Option<MatmulCoop>,
}

impl Linear {
    /// Builds every type's pipelines. The matvec reduction needs a subgroup size dividing 32:
    /// devices whose subgroups may be wider get 32 required, or an error without size control.
    /// CPU drivers whose subgroups are (or can be made) 8 wide get the `linear_cpu.comp`
    /// variants.
    pub fn new(ctx: &Context) -> Result<Self> {
        let cpu = ctx.caps().kind == DeviceKind::Cpu && cpu_layout_runs(ctx);
        Self::with_layout(ctx, cpu)
    }

    /// The GPU kernels even on a CPU driver, where [`Linear::new`] picks the CPU-driver ones:
    /// tests of the GPU-only paths (fused norms, the fused GLU with its norm) on lavapipe.
    pub fn with_gpu_layout(ctx: &Context) -> Result<Self> {
        Self::with_layout(ctx, false)
    }

    /// Builds the CPU-driver variants when `cpu`, else the GPU ones (tests run both anywhere).
    pub(crate) fn with_layout(ctx: &Context, cpu: bool) -> Result<Self> {
        let mut matvec = Vec::with_capacity(TYPES.len());
        let mut matvec_glu = Vec::with_capacity(TYPES.len());
        let mut matmul = Vec::with_capacity(TYPES.len());
        if cpu {
            let sg = &ctx.caps().subgroup;
            let required = (sg.size != CPU_SUBGROUP).then_some(CPU_SUBGROUP);
            for i in 0..TYPES.len() {
                for (op, bindings, push) in [
                    (QOp::MatvecCpu, 4, PUSH_BYTES),
                    (QOp::MatvecGluCpu, GLU_BINDINGS, GLU_PUSH_BYTES),
                    (QOp::MatmulCpu, 4, PUSH_BYTES),
                ] {
                    let mut desc = PipelineDesc::new(variant(op, i), bindings, push);
                    if let Some(size) = required {
                        desc = desc.subgroup_size(size);
                    }
                    let pl = Pipeline::new(ctx, &desc)?;
                    match op {
                        QOp::MatvecCpu => matvec.push(Matvec::Fixed(pl)),
                        QOp::MatvecGluCpu => matvec_glu.push(Matvec::Fixed(pl)),
                        _ => matmul.push(pl),
                    }
                }
            }
            return Ok(Linear {
                matvec,
                matvec_glu,
                matmul,
                cpu,
                coop: None,
            });
        }
        let sg = &ctx.caps().subgroup;
        let required = if sg.max_size > MATVEC_TPR || !MATVEC_TPR.is_multiple_of(sg.size) {
            if !(sg.size_control && sg.min_size <= MATVEC_TPR) {
                return Err(KernelError::Vk(VkError::Unsupported {
                    device: ctx.caps().name.clone(),
                    reason: format!(
                        "linear: matvec needs a subgroup size dividing {MATVEC_TPR} (device: {}..={})",
                        sg.min_size, sg.max_size
                    ),
                }));
            }
            Some(MATVEC_TPR)
        } else {
            None
        };
        for i in 0..TYPES.len() {
            let (mv, glu) = (variant(QOp::Matvec, i), variant(QOp::MatvecGlu, i));
            matvec.push(Matvec::Spec(
                SpecPipelines::new(mv, MATVEC_BINDINGS, MATVEC_PUSH_BYTES, mv.name)
                    .subgroup_size(required),
            ));
            matvec_glu.push(Matvec::Spec(
                SpecPipelines::new(glu, MATVEC_BINDINGS + 1, MATVEC_PUSH_BYTES + 4, glu.name)
                    .subgroup_size(required),
            ));
            let desc = PipelineDesc::new(variant(QOp::Matmul, i), 4, PUSH_BYTES);
            matmul.push(Pipeline::new(ctx, &desc)?);
        }
        let coop = if MatmulCoop::supported(ctx.caps()) {
            Some(MatmulCoop::new(ctx)?)
        } else {
            None
        };
        Ok(Linear {
            matvec,
            matvec_glu,
            matmul,
            cpu,
            coop,
        })
    }

    /// The same kernels with type `ty`'s single-token matvec and GLU pipelines built from other
    /// `matvec.comp` variants (benchmark experiments of `variants.txt`).
    #[cfg(test)]
    pub(crate) fn with_matvec_variants(
        mut self,
        ty: GgmlType,
        mv: octoflow_vk::Shader,
        glu: octoflow_vk::Shader,
    ) -> Self {
        let ti = TYPES
            .iter()
            .position(|&t| t == ty)
            .expect("a supported type");
        self.matvec[ti] = Matvec::Spec(SpecPipelines::new(
            mv,
            MATVEC_BINDINGS,
            MATVEC_PUSH_BYTES,
            mv.name,
        ));
        self.matvec_glu[ti] = Matvec::Spec(SpecPipelines::new(
            glu,
            MATVEC_BINDINGS + 1,
            MATVEC_PUSH_BYTES + 4,
            glu.name,
        ));
        self
    }

    /// The same kernels without the cooperative-matrix path (benchmarks compare the two).
    #[cfg(test)]
    pub(crate) fn without_coop(mut self) -> Self {
        self.coop = None;
        self
    }

    /// Whether a batch of `n_tokens` runs on the cooperative-matrix kernel, whose products
    /// are of f16-rounded weights and inputs ([`crate::matmul_coop::matmul_coop_ref`]).
    pub fn uses_coop(&self, n_tokens: u32) -> bool {
        self.coop.is_some() && n_tokens >= coop_min_tokens()
    }

    /// Whether a batch of `n_tokens` can take [`LinearArgs::norm`] (the GPU matvec kernel).
    pub fn fuses_norm(&self, n_tokens: u32) -> bool {
        !self.cpu && n_tokens <= MATVEC_MAX_TOKENS && !self.uses_coop(n_tokens)
    }

    /// Whether [`Linear::record_glu`] takes a batch of `n_tokens` with gate and up matrices of
    /// these types: a batch for the cooperative-matrix kernel ([`Linear::uses_coop`]) or else
    /// 1 ..= [`MATVEC_MAX_TOKENS`] tokens (the matvec path), and one supported type for both. The
    /// matrices must also have the same shape (`record_glu` checks it).
    pub fn fuses_glu(&self, n_tokens: u32, gate_ty: GgmlType, up_ty: GgmlType) -> bool {
        let path = (1..=MATVEC_MAX_TOKENS).contains(&n_tokens) || self.coop_glu(n_tokens);
        path && gate_ty == up_ty && Self::supports(gate_ty)
    }

    /// Whether a batch of `n_tokens` takes the fused gate/up/activation of the
    /// cooperative-matrix kernel.
    fn coop_glu(&self, n_tokens: u32) -> bool {
        self.uses_coop(n_tokens) && self.coop.as_ref().is_some_and(|c| c.glu.is_some())
    }

    /// Whether a layout given for the matvec kernel (benchmarks and tests comparing layouts)
    /// takes this batch to it even where the cooperative-matrix kernel would take it.
    fn forces_matvec(&self, plan: Option<MatvecPlan>, n_tokens: u32) -> bool {
        plan.is_some() && !self.cpu && (1..=MATVEC_MAX_TOKENS).contains(&n_tokens)
    }

    /// A fused norm needs the matvec kernel: refuses a batch that goes elsewhere (unless a
    /// matvec layout was `forced`).
    fn check_norm_path(&self, n_tokens: u32, forced: bool) -> Result<()> {
        if self.fuses_norm(n_tokens) || forced {
            return Ok(());
        }
        Err(KernelError::Shape {
            op: OP,
            detail: format!(
                "a fused norm needs the matvec kernel (GPU layout; at most {MATVEC_MAX_TOKENS} tokens, fewer than {COOP_MIN_TOKENS} with cooperative matrices)"
            ),
        })
    }

    /// Whether the kernels read weights of type `ty`.
    pub fn supports(ty: GgmlType) -> bool {
        TYPES.contains(&ty)
    }

    /// Records `y (=|+=) x · Wᵀ (+ bias)`: the cooperative-matrix kernel for batches of
    /// [`COOP_MIN_TOKENS`] or more where the device has it, else the matvec kernel for
    /// `n_tokens <=` [`MATVEC_MAX_TOKENS`], the tiled matmul above. Checks the type, the shapes and every
    /// operand's size. `y` must not alias `x`, `bias` or the weights.
    pub fn record(&self, chain: &mut Chain, a: &LinearArgs) -> Result<()> {
        self.record_with(chain, a, None)
    }

    /// [`Linear::record`], the GPU matvec in the work layout `plan` where given (benchmarks and
    /// tests compare layouts), else in [`MatvecPlan::choose`]'s.
    pub(crate) fn record_with(
        &self,
        chain: &mut Chain,
        a: &LinearArgs,
        plan: Option<MatvecPlan>,
    ) -> Result<()> {
        let Checked { ti, push, bindings } = check_args(a)?;
        let forced = self.forces_matvec(plan, a.n_tokens);
        let plan = plan.unwrap_or_else(|| MatvecPlan::choose(a.w.n_rows, a.w.n_cols, a.n_tokens));
        let w = &a.w;
        if a.pending.is_some() && a.norm.is_none() {
            return Err(KernelError::Shape {
                op: OP,
                detail: "a pending post-norm needs the fused norm".into(),
            });
        }
        if let Some((g, eps)) = a.norm {
            self.check_norm_path(a.n_tokens, forced)?;
            check_words(OP, "norm", g, u64::from(w.n_cols), "floats")?;
            return self.record_matvec(chain, ti, a, &bindings, push, plan, Some((g, eps)));
        }
        if let Some(coop) = self
            .coop
            .as_ref()
            .filter(|_| self.uses_coop(a.n_tokens) && !forced)
        {
            return coop.dispatch(chain, ti, a, &bindings, &push);
        }
        let small = a.n_tokens <= MATVEC_MAX_TOKENS;
        if self.cpu && small {
            let (pipeline, groups) =
                self.matvec[ti].layout(chain, w.n_rows, a.n_tokens, plan, false)?;
            chain.dispatch(&pipeline, &bindings, &push, groups)?;
        } else if self.cpu {
            let groups = cpu_groups(chain, w.n_rows, a.n_tokens, CPU_MATMUL_TN)?;
            chain.dispatch(&self.matmul[ti], &bindings, &push, groups)?;
        } else if small {
            return self.record_matvec(chain, ti, a, &bindings, push, plan, None);
        } else {
            let groups = [
                w.n_rows.div_ceil(MATMUL_TM),
                a.n_tokens.div_ceil(MATMUL_TN),
                1,
            ];
            chain.dispatch(&self.matmul[ti], &bindings, &push, groups)?;
        }
        let (bytes, flops) = product_cost(a);
        chain.set_cost(bytes, flops);
        Ok(())
    }

    /// The GPU matvec of checked arguments, with the RMSNorm `norm` (weight, eps) fused on its
    /// input where given, in the work layout `plan`.
    #[allow(clippy::too_many_arguments)]
    fn record_matvec(
        &self,
        chain: &mut Chain,
        ti: usize,
        a: &LinearArgs,
        bindings: &[BufferSlice; 4],
        push: Push,
        plan: MatvecPlan,
        norm: Option<(&BufferSlice, f32)>,
    ) -> Result<()> {
        let (pend, pb) = check_pending(a.pending, &a.w, a.x, a.y, a.n_tokens, plan)?;
        let (pipeline, groups) =
            self.matvec[ti].layout(chain, a.w.n_rows, a.n_tokens, plan, pb.is_some())?;
        let [wb, x, y, bias] = bindings.clone();
        // no norm: x stands in for its binding (never read)
        let (g, eps) = norm.map_or_else(|| (x.clone(), 0.0), |(g, eps)| (g.clone(), eps));
        let push = push.f32(eps).u32(u32::from(norm.is_some())).u32(pend);
        let [p, pw, settle] = pb.unwrap_or_else(|| [x.clone(), x.clone(), y.clone()]);
        chain.dispatch(
            &pipeline,
            &[wb, x, y, bias, g, p, pw, settle],
            &push,
            groups,
        )?;
        let (bytes, flops) = product_cost(a);
        chain.set_cost(bytes, flops);
        Ok(())
    }
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
fn check_pending(
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

/// The work layout of one GPU matvec dispatch (`matvec.comp`'s specialization constants).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MatvecPlan {
    /// Invocations per workgroup (a multiple of `tpr`).
    pub wg: u32,
    /// Invocations per row: a multiple of [`MATVEC_TPR`].
    pub tpr: u32,
    /// Tokens the pipeline takes at most (1 ..= [`MATVEC_MAX_TOKENS`]).
    pub maxt: u32,
    /// Consecutive rows per invocation (sharing its reads of x), at least 1.
    pub rpt: u32,
}

impl MatvecPlan {
    /// The layout before per-shape plans (and the only one of the CPU layout, which ignores it).
    #[cfg(test)]
    pub(crate) const DEFAULT: MatvecPlan = MatvecPlan {
        wg: 128,
        tpr: MATVEC_TPR,
        maxt: MATVEC_MAX_TOKENS,
        rpt: 1,
    };

    /// The layout for `n_tokens` (1 ..= [`MATVEC_MAX_TOKENS`]) tokens of an `n_rows` x `n_cols`
    /// matrix.
    /// Measured on the H100 over every layout at the decode shapes of the three models
    /// (`matvec_layouts` in linear_bench.rs, docs/BENCHMARKS.md): long rows (64+ chunks, the
    /// FFN down projections) gain from 128 invocations per row for one token (qwen's 896 x 4864
    /// Q4_K 12.9 → 9.9 us) and 64 for a few; pipelines for exactly the tokens they take hold
    /// fewer registers (56 against 80); single-token pipelines read each chunk of x once for
    /// all of an invocation's rows, so vocabulary-sized matrices take four rows per invocation
    /// and long rows two; the type does not change the choice.
    pub(crate) fn choose(n_rows: u32, n_cols: u32, n_tokens: u32) -> MatvecPlan {
        let maxt = n_tokens.clamp(1, MATVEC_MAX_TOKENS).next_power_of_two();
        let long = n_cols.div_ceil(32) >= 64;
        let vocab = n_rows >= 32768;
        if Self::stages_x(maxt) {
            // two or four tokens: x staged in shared memory 32 chunks at a time, one chunk per
            // lane (wider rows would leave lanes idle); four row groups share each staged tile,
            // and vocabulary-sized matrices give each lane four rows, so that fewer workgroups
            // stage x
            let rpt = if vocab { 4 } else { 1 };
            return MatvecPlan {
                wg: 4 * MATVEC_TPR,
                tpr: MATVEC_TPR,
                maxt,
                rpt,
            };
        }
        let (wg, tpr) = match (long, maxt) {
            (true, 1) => (128, 128),
            (true, _) => (64, 64),
            (false, _) => (64, MATVEC_TPR),
        };
        // one token: x is read once per chunk for all of an invocation's rows, which pays on
        // vocabulary-sized matrices (qwen's 151936 x 896 output: 109 µs at 4 rows, 171 at 2)
        // and a little on long rows (896 x 4864 Q4_K: 8.6 → 8.0 µs at 2)
        let rpt = match (maxt, vocab, long) {
            (1, true, _) => 4,
            (1, false, true) => 2,
            _ => 1,
        };
        MatvecPlan { wg, tpr, maxt, rpt }
    }

    /// [`MatvecPlan::choose`] for the gate/up/activation dispatch: two rows per invocation for
    /// one token over 4096+ rows, so that each chunk of x (and of the norm's g, with the sum of
    /// squares when the norm is fused) is read once for two rows of both matrices (H100, qwen's
    /// 4864 x 896 Q5_0 with the norm fused: 11.9 µs; smollm2's 1536 x 576 loses at two, 5.6 →
    /// 6.0 µs).
    pub(crate) fn choose_glu(n_rows: u32, n_cols: u32, n_tokens: u32) -> MatvecPlan {
        let plan = Self::choose(n_rows, n_cols, n_tokens);
        if plan.maxt == 1 && n_rows >= 4096 {
            MatvecPlan { rpt: 2, ..plan }
        } else {
            plan
        }
    }

    /// Whether pipelines for `maxt` tokens stage x in shared memory (`STAGED` in
    /// `matvec.comp`): two or four tokens.
    pub(crate) fn stages_x(maxt: u32) -> bool {
        matches!(maxt, 2 | 4)
    }

    /// Rows per workgroup.
    fn rows(&self) -> u32 {
        self.wg / self.tpr * self.rpt
    }

    /// Shared-memory bytes of the layout (`partial` in `matvec.comp`, the GLU variant's size),
    /// with the pending post-norm's sums where `pend`.
    /// Pipelines for two or four tokens stage x (32 chunks of 32 floats per token) in memory
    /// the partial sums share.
    fn shared_bytes(&self, pend: bool) -> u32 {
        let pend = if pend { 2 * self.rpt + 3 } else { 0 };
        let partial = 4 * (2 * self.maxt * self.rpt + self.maxt + pend) * self.wg;
        if Self::stages_x(self.maxt) {
            partial.max(self.maxt * 32 * 32 * 4) + 4
        } else {
            partial + 16
        }
    }
}

/// A matvec shader's pipelines: one per work layout (GPU layout) or one fixed (CPU layout).
enum Matvec {
    Spec(SpecPipelines),
    Fixed(Pipeline),
}

impl Matvec {
    /// The pipeline and workgroup grid of `n_rows` rows in the layout `plan` (GPU layout; the
    /// CPU layout has one layout and ignores the plan), the pipeline with the pending post-norm
    /// path where `pend` (`PEND` in `matvec.comp`).
    /// Errors on a plan that does not fit `n_tokens` or the device.
    fn layout(
        &self,
        chain: &Chain,
        n_rows: u32,
        n_tokens: u32,
        plan: MatvecPlan,
        pend: bool,
    ) -> Result<(Pipeline, [u32; 3])> {
        match self {
            Matvec::Fixed(pl) => Ok((
                pl.clone(),
                cpu_groups(chain, n_rows, n_tokens, CPU_MATVEC_TN)?,
            )),
            Matvec::Spec(s) => {
                let ctx = chain.context();
                let p = plan;
                if p.tpr == 0
                    || !p.tpr.is_multiple_of(MATVEC_TPR)
                    || !p.wg.is_multiple_of(p.tpr)
                    || p.wg > ctx.caps().max_workgroup_invocations
                    || p.rpt == 0
                    || p.shared_bytes(pend) > ctx.caps().max_shared_memory
                    || !(n_tokens..=MATVEC_MAX_TOKENS).contains(&p.maxt)
                {
                    return Err(KernelError::Shape {
                        op: OP,
                        detail: format!("matvec layout {p:?} does not fit {n_tokens} tokens"),
                    });
                }
                let spec = [
                    plan.wg,
                    plan.tpr,
                    plan.maxt,
                    plan.rpt,
                    u32::from(pend),
                    0,
                    0,
                ];
                let pl = s.get(ctx, spec)?;
                let groups = ctx.groups_1d(u64::from(n_rows), plan.rows())?;
                Ok((pl, groups))
            }
        }
    }
}

impl Linear {
    /// Records `y[t, r] = act(dot(gate row r, x[t])) * dot(up row r, x[t])` (see
    /// [`LinearGluArgs`]) as one dispatch: the matvec kernel's GLU variant. Errors unless
    /// [`Linear::fuses_glu`] holds and gate and up have the same shape, and on any operand's
    /// size (as [`Linear::record`]).
    pub fn record_glu(&self, chain: &mut Chain, a: &LinearGluArgs) -> Result<()> {
        self.record_glu_with(chain, a, None)
    }

    /// [`Linear::record_glu`] in the work layout `plan` where given (as
    /// [`Linear::record_with`]).
    pub(crate) fn record_glu_with(
        &self,
        chain: &mut Chain,
        a: &LinearGluArgs,
        plan: Option<MatvecPlan>,
    ) -> Result<()> {
        let shape = |detail: String| KernelError::Shape { op: OP, detail };
        let (g, u) = (&a.gate, &a.up);
        if g.ty != u.ty {
            return Err(shape(format!(
                "fused GLU: gate is {} and up {}: both must have one type",
                g.ty, u.ty
            )));
        }
        if (g.n_rows, g.n_cols) != (u.n_rows, u.n_cols) {
            return Err(shape(format!(
                "fused GLU: gate is {}x{} and up {}x{}: both must have one shape",
                g.n_rows, g.n_cols, u.n_rows, u.n_cols
            )));
        }
        // type, shapes, x and y (as one product of the gate)
        let Checked { ti, push, bindings } = check_args(&LinearArgs {
            w: *g,
            x: a.x,
            y: a.y,
            n_tokens: a.n_tokens,
            y_stride: g.n_rows,
            y_col: 0,
            bias: None,
            accumulate: false,
            norm: None,
            pending: None,
        })?;
        if !self.fuses_glu(a.n_tokens, g.ty, u.ty) {
            return Err(shape(format!(
                "fused GLU: {} tokens; it takes 1..={MATVEC_MAX_TOKENS} (the matvec kernel) or, \
                 with cooperative matrices, any batch ({COOP_MIN_TOKENS} or more on them)",
                a.n_tokens
            )));
        }
        let rb = row_bytes(OP, u.ty, u.n_cols)?;
        let up = word_slice(
            OP,
            "up weights",
            u.data,
            u64::from(u.n_rows) * u64::from(rb),
        )?;
        let [wb, x, y, bias] = bindings;
        if a.pending.is_some() && a.norm.is_none() {
            return Err(shape("a pending post-norm needs the fused norm".into()));
        }
        let forced = self.forces_matvec(plan, a.n_tokens);
        let norm = match a.norm {
            Some((nw, eps)) => {
                self.check_norm_path(a.n_tokens, forced)?;
                check_words(OP, "norm", nw, u64::from(g.n_cols), "floats")?;
                Some((nw.clone(), eps))
            }
            None => None,
        };
        if let Some(coop) = self
            .coop
            .as_ref()
            .filter(|_| self.coop_glu(a.n_tokens) && !forced)
        {
            // a norm was refused above: only the matvec kernel fuses one
            return coop.dispatch_glu(chain, None, ti, a, &wb, &up, rb);
        }
        let plan = plan.unwrap_or_else(|| MatvecPlan::choose_glu(g.n_rows, g.n_cols, a.n_tokens));
        let (pend, pb) = check_pending(a.pending, g, a.x, a.y, a.n_tokens, plan)?;
        let mut push = push
            .f32(norm.as_ref().map_or(0.0, |n| n.1))
            .u32(u32::from(norm.is_some()))
            .u32(a.op.code());
        if !self.cpu {
            push = push.u32(pend);
        }
        // no norm: x stands in for its binding (never read)
        let nw = norm.map_or_else(|| x.clone(), |n| n.0);
        let (pipeline, groups) =
            self.matvec_glu[ti].layout(chain, g.n_rows, a.n_tokens, plan, pb.is_some())?;
        let mut bind = vec![wb, x.clone(), y.clone(), bias, nw, up];
        if !self.cpu {
            bind.extend(pb.unwrap_or_else(|| [x.clone(), x, y]));
        }
        chain.dispatch(&pipeline, &bind, &push, groups)?;
        let (bytes, flops) = glu_cost(a);
        chain.set_cost(bytes, flops);
        Ok(())
    }
}

/// The workgroup grid of the CPU-driver kernels for `n_rows` x `n_tokens` (`tn` tokens per
/// workgroup), or a shape error past the device's limits.
fn cpu_groups(chain: &Chain, n_rows: u32, n_tokens: u32, tn: u32) -> Result<[u32; 3]> {
    let groups = [n_rows.div_ceil(CPU_ROWS), n_tokens.div_ceil(tn), 1];
    let max = chain.context().caps().max_workgroup_count;
    if groups[0] > max[0] || groups[1] > max[1] {
        return Err(KernelError::Shape {
            op: OP,
            detail: format!(
                "{n_rows} rows x {n_tokens} tokens need {}x{} workgroups, over {}x{}",
                groups[0], groups[1], max[0], max[1]
            ),
        });
    }
    Ok(groups)
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

/// Whether the CPU-driver variants can run here: subgroups are, or can be made, 8 wide.
fn cpu_layout_runs(ctx: &Context) -> bool {
    let sg = &ctx.caps().subgroup;
    sg.size == CPU_SUBGROUP
        || (sg.size_control && (sg.min_size..=sg.max_size).contains(&CPU_SUBGROUP))
}

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

/// CPU reference of [`Linear::record_glu`]: the gate and up products as [`linear_ref`], then
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

#[cfg(test)]
pub(crate) mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use octoflow_vk::{Buffer, MemoryKind};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::check_close;

    /// The shader decodes weights exactly as the CPU codec (up to a fused multiply-add in
    /// `d*q + m`) and sums up to ~1000 f32 products in another order than the f64 reference:
    /// typical errors are ~sqrt(n)·2⁻²⁴ ≈ 1e-6 of the output scale, and `check_close` divides by
    /// at least 1% of that scale, so an output near that floor reads ~1e-4 (CI saw 1.04e-4 on a
    /// Q5_1 928-column row with the CPU-driver layout). 5e-4 leaves margin, while a single
    /// misdecoded weight or a wrong scale moves an output by >= 1e-2 of the scale (relative >= 1
    /// at the floor).
    const REL: f32 = 5e-4;

    /// The signature shared by [`linear_ref`] and [`crate::matmul_coop_ref`].
    type RefFn = fn(
        GgmlType,
        &[u8],
        usize,
        usize,
        &[f32],
        usize,
        &mut [f32],
        usize,
        usize,
        Option<&[f32]>,
        bool,
    ) -> Result<(), QuantError>;

    pub(crate) fn buffer_with(ctx: &Context, name: &str, bytes: &[u8]) -> Buffer {
        let size = (bytes.len() as u64).next_multiple_of(4);
        let b = Buffer::new(ctx, name, size, MemoryKind::DeviceLocal).unwrap();
        let mut padded = bytes.to_vec();
        padded.resize(size as usize, 0);
        ctx.upload(&b, 0, &padded).unwrap();
        b
    }

    /// Random `n_rows x n_cols` weights in `ty`'s encoding.
    pub(crate) fn random_weights(
        rng: &mut StdRng,
        ty: GgmlType,
        n_rows: usize,
        n_cols: usize,
    ) -> Vec<u8> {
        let f: Vec<f32> = (0..n_rows * n_cols)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let mut q = vec![0u8; octoflow_gguf::quant::quantized_size(ty, n_rows * n_cols).unwrap()];
        octoflow_gguf::quant::quantize(ty, &f, &mut q).unwrap();
        q
    }

    /// A column count for `ty`: K-quants 256..1024, legacy 96..1024 in blocks, floats any (odd too).
    pub(crate) fn random_cols(rng: &mut StdRng, ty: GgmlType) -> usize {
        match ty.block_size() {
            1 => rng.gen_range(1..700),
            bs => bs * rng.gen_range((96 / bs).max(1)..=1024 / bs),
        }
    }

    fn check_type(ty: GgmlType) {
        for cpu in [false, true] {
            check_layout(ty, cpu);
        }
    }

    /// Random shapes and options of `ty` through the GPU (`cpu` false) or CPU-driver kernels.
    fn check_layout(ty: GgmlType, cpu: bool) {
        let Some(ctx) = gpu_or_skip(&format!("linear_{ty}")) else {
            return;
        };
        if cpu && !cpu_layout_runs(&ctx) {
            // The H100's subgroups are 32 wide and cannot be made 8: that layout never runs there.
            println!("linear_{ty}: CPU-driver layout skipped (no 8-wide subgroups)");
            return;
        }
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let lin = Linear::with_layout(&ctx, cpu).unwrap();
        let n_rows = rng.gen_range(96..300usize);
        let n_cols = random_cols(&mut rng, ty);
        let wq = random_weights(&mut rng, ty, n_rows, n_cols);
        let wb = buffer_with(&ctx, "w", &wq);
        let bias: Vec<f32> = (0..n_rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let bb = buffer_with(&ctx, "bias", octoflow_vk::as_bytes(&bias));
        for (case, n_tokens) in [1usize, 2, 4, 7, 33, 70].into_iter().enumerate() {
            let with_bias = case % 2 == 0;
            let accumulate = case % 3 == 1;
            let y_col = if case % 2 == 1 {
                rng.gen_range(1..9)
            } else {
                0
            };
            let y_stride = y_col + n_rows + rng.gen_range(0..5);
            let x: Vec<f32> = (0..n_tokens * n_cols)
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            let xb = buffer_with(&ctx, "x", octoflow_vk::as_bytes(&x));
            let y_len = n_tokens * y_stride;
            let y0: Vec<f32> = if accumulate {
                (0..y_len).map(|_| rng.gen_range(-1.0..1.0)).collect()
            } else {
                vec![f32::NAN; y_len]
            };
            let yb = buffer_with(&ctx, "y", octoflow_vk::as_bytes(&y0));
            let bias_slice = with_bias.then(|| bb.whole());
            // RMSNorm fused on the input where the kernel takes it (1, 2 and 7 tokens)
            let fused = lin.fuses_norm(n_tokens as u32) && case != 2;
            let g: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(0.5..1.5)).collect();
            let gb = buffer_with(&ctx, "norm", octoflow_vk::as_bytes(&g));
            let gs = gb.whole();
            let eps = 1e-6f32;
            let args = LinearArgs {
                w: QWeightRef {
                    ty,
                    data: &wb.whole(),
                    n_rows: n_rows as u32,
                    n_cols: n_cols as u32,
                },
                x: &xb.whole(),
                y: &yb.whole(),
                n_tokens: n_tokens as u32,
                y_stride: y_stride as u32,
                y_col: y_col as u32,
                bias: bias_slice.as_ref(),
                accumulate,
                norm: fused.then_some((&gs, eps)),
                pending: None,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            lin.record(&mut chain, &args).unwrap();
            chain.run().unwrap();
            let mut got = vec![0f32; y_len];
            ctx.download(&yb, 0, &mut got).unwrap();
            let mut want = y0.clone();
            // The coopmat path multiplies f16-rounded operands: its own reference and bound.
            let coop = lin.uses_coop(n_tokens as u32);
            let (reference, rel) = if coop {
                (
                    crate::matmul_coop_ref as RefFn,
                    crate::matmul_coop::tests::REL_COOP,
                )
            } else {
                (linear_ref as RefFn, REL)
            };
            let x_in = if fused {
                let mut h = vec![0f32; x.len()];
                crate::rms_norm_ref(&x, &g, &mut h, n_cols, eps);
                h
            } else {
                x.clone()
            };
            reference(
                ty,
                &wq,
                n_rows,
                n_cols,
                &x_in,
                n_tokens,
                &mut want,
                y_stride,
                y_col,
                with_bias.then_some(&bias[..]),
                accumulate,
            )
            .unwrap();
            let what = format!(
                "{ty} (cpu layout {cpu}, coopmat {coop}, fused norm {fused}) {n_rows}x{n_cols}, {n_tokens} tokens, \
                bias {with_bias}, accumulate {accumulate}, y_col {y_col}, y_stride {y_stride}, seed {seed}"
            );
            for t in 0..n_tokens {
                let row = t * y_stride;
                let (g, wv) = (&got[row..row + y_stride], &want[row..row + y_stride]);
                let inside = y_col..y_col + n_rows;
                if let Err(e) = check_close(&g[inside.clone()], &wv[inside.clone()], rel) {
                    panic!("{what}: token {t}: {e}");
                }
                for c in (0..y_stride).filter(|c| !inside.contains(c)) {
                    assert_eq!(
                        g[c].to_bits(),
                        y0[row + c].to_bits(),
                        "{what}: column {c} of token {t} was written"
                    );
                }
            }
        }
        assert_no_validation_errors(&ctx);
    }

    macro_rules! type_tests {
        ($($name:ident => $ty:ident),*) => {$(
            #[test]
            fn $name() {
                check_type(GgmlType::$ty);
            }
        )*};
    }

    type_tests!(
        gpu_linear_f32 => F32, gpu_linear_f16 => F16, gpu_linear_q4_0 => Q4_0,
        gpu_linear_q4_1 => Q4_1, gpu_linear_q5_0 => Q5_0, gpu_linear_q5_1 => Q5_1,
        gpu_linear_q8_0 => Q8_0, gpu_linear_q4_k => Q4_K, gpu_linear_q5_k => Q5_K,
        gpu_linear_q6_k => Q6_K
    );

    /// Every matvec work layout the kernels can be asked for ([`MatvecPlan`]: 32 to 256
    /// invocations per row, one or two row groups per workgroup, 1 to 4 rows per invocation,
    /// pipelines for 1 to 8 tokens) on the GPU layout: plain with bias and accumulate, with a
    /// fused norm, and the fused GLU, over random types and shapes whose rows leave the last
    /// workgroup partly empty, against the CPU references; y poisoned with NaN (past its end
    /// too for the GLU).
    #[test]
    fn gpu_matvec_layouts_agree_with_the_references() {
        use crate::operand::test_bufs::{poisoned, read, with};
        let Some(ctx) = gpu_or_skip("matvec_layouts") else {
            return;
        };
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let lin = Linear::with_layout(&ctx, false).unwrap();
        let mut plans = vec![];
        for tpr in [32u32, 64, 128, 256] {
            for wg in [tpr, 2 * tpr] {
                for (maxt, rpt) in [(1u32, 1u32), (1, 4), (2, 2), (8, 1)] {
                    let plan = MatvecPlan { wg, tpr, maxt, rpt };
                    if wg <= 256 && plan.shared_bytes(false) <= ctx.caps().max_shared_memory {
                        plans.push(plan);
                    }
                }
            }
        }
        // a random dozen per run (every pipeline compiles on lavapipe), those of the plans
        // `choose` makes always
        use rand::seq::SliceRandom;
        plans.shuffle(&mut rng);
        plans.truncate(12);
        for (rows, cols, tokens) in [
            (896, 896, 1),
            (896, 4864, 1),
            (896, 4864, 4),
            (65536, 896, 1),
        ] {
            for chosen in [
                MatvecPlan::choose(rows, cols, tokens),
                MatvecPlan::choose_glu(rows, cols, tokens),
            ] {
                if !plans.contains(&chosen) {
                    plans.push(chosen);
                }
            }
        }
        let eps = 1e-6f32;
        for plan in plans {
            let ty = TYPES[rng.gen_range(0..TYPES.len())];
            // pipelines for two or four tokens stage x 1024 columns at a time: half the cases
            // have a second, partial tile (and fewer rows, for lavapipe's time)
            let (n_rows, n_cols) = match ty.block_size() {
                bs if MatvecPlan::stages_x(plan.maxt) && bs > 1 && rng.gen_bool(0.5) => (
                    rng.gen_range(37..80usize),
                    bs * rng.gen_range(1056 / bs..=1800 / bs),
                ),
                _ => (rng.gen_range(37..200usize), random_cols(&mut rng, ty)),
            };
            let n_tokens = rng.gen_range(1..=plan.maxt as usize);
            let what = format!("{plan:?} {ty} {n_rows}x{n_cols}, {n_tokens} tokens, seed {seed}");
            let wq = random_weights(&mut rng, ty, n_rows, n_cols);
            let uq = random_weights(&mut rng, ty, n_rows, n_cols);
            let (wb, ub) = (buffer_with(&ctx, "w", &wq), buffer_with(&ctx, "u", &uq));
            let x: Vec<f32> = (0..n_tokens * n_cols)
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            let g: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(0.5..1.5)).collect();
            let bias: Vec<f32> = (0..n_rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let (xb, gb, bb) = (
                with(&ctx, "x", &x),
                with(&ctx, "g", &g),
                with(&ctx, "b", &bias),
            );
            let (gs, bs) = (gb.whole(), bb.whole());
            let mut normed = vec![0f32; x.len()];
            crate::rms_norm_ref(&x, &g, &mut normed, n_cols, eps);
            let len = n_tokens * n_rows;
            let w = |data| QWeightRef {
                ty,
                data,
                n_rows: n_rows as u32,
                n_cols: n_cols as u32,
            };
            let (ws, us) = (wb.whole(), ub.whole());
            // plain (bias, accumulate) and with a fused norm
            for fused in [false, true] {
                let y0: Vec<f32> = (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let yb = with(&ctx, "y", &y0);
                let args = LinearArgs {
                    w: w(&ws),
                    x: &xb.whole(),
                    y: &yb.whole(),
                    n_tokens: n_tokens as u32,
                    y_stride: n_rows as u32,
                    y_col: 0,
                    bias: (!fused).then_some(&bs),
                    accumulate: !fused,
                    norm: fused.then_some((&gs, eps)),
                    pending: None,
                };
                if fused {
                    let nan = vec![f32::NAN; len];
                    ctx.upload(&yb, 0, octoflow_vk::as_bytes(&nan)).unwrap();
                }
                let mut chain = Chain::new(&ctx).unwrap();
                lin.record_with(&mut chain, &args, Some(plan)).unwrap();
                chain.run().unwrap();
                let got = read(&ctx, &yb, len);
                let mut want = if fused { vec![0f32; len] } else { y0.clone() };
                let input = if fused { &normed } else { &x };
                let b = (!fused).then_some(&bias[..]);
                linear_ref(
                    ty, &wq, n_rows, n_cols, input, n_tokens, &mut want, n_rows, 0, b, !fused,
                )
                .unwrap();
                if let Err(e) = check_close(&got, &want, REL) {
                    panic!("{what} (fused norm {fused}): {e}");
                }
            }
            // the fused GLU with the norm
            let yb = poisoned(&ctx, "y", len + 5);
            let args = LinearGluArgs {
                gate: w(&ws),
                up: w(&us),
                x: &xb.whole(),
                y: &yb.slice(0, 4 * len as u64).unwrap(),
                n_tokens: n_tokens as u32,
                op: GluOp::Silu,
                norm: Some((&gs, eps)),
                pending: None,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            lin.record_glu_with(&mut chain, &args, Some(plan)).unwrap();
            chain.run().unwrap();
            let got = read(&ctx, &yb, len + 5);
            let mut want = vec![0f32; len];
            linear_glu_ref(
                ty,
                &wq,
                &uq,
                n_rows,
                n_cols,
                &normed,
                n_tokens,
                &mut want,
                GluOp::Silu,
            )
            .unwrap();
            if let Err(e) = check_close(&got[..len], &want, REL) {
                panic!("{what} (GLU): {e}");
            }
            assert!(
                got[len..].iter().all(|v| v.is_nan()),
                "{what}: written past y's end"
            );
        }
        assert_no_validation_errors(&ctx);
    }

    /// A post-norm pending on the input (`x + rms_norm(p) * gp`, then the fused norm): the
    /// matvec and the fused GLU in every one-token layout (and the chosen ones) against the
    /// references of the settled input, over random types and shapes; the settled stream
    /// written by one dispatch checked against its addends; the plain fused norm in the same
    /// layouts. Outputs poisoned with NaN.
    #[test]
    fn gpu_pending_post_norm_matches_the_reference() {
        use crate::operand::test_bufs::{poisoned, read, with};
        let Some(ctx) = gpu_or_skip("matvec_pending_norm") else {
            return;
        };
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let lin = Linear::with_layout(&ctx, false).unwrap();
        let mut plans = vec![];
        for tpr in [32u32, 64, 128] {
            for wg in [tpr, 2 * tpr] {
                for rpt in [1u32, 2, 4] {
                    plans.push(MatvecPlan {
                        wg,
                        tpr,
                        maxt: 1,
                        rpt,
                    });
                }
            }
        }
        // a random few per run (pipelines compile slowly on lavapipe), the chosen ones always
        use rand::seq::SliceRandom;
        plans.shuffle(&mut rng);
        plans.truncate(4);
        for (rows, cols) in [(1024, 640), (2048, 640), (640, 2048), (4864, 896)] {
            for chosen in [
                MatvecPlan::choose(rows, cols, 1),
                MatvecPlan::choose_glu(rows, cols, 1),
            ] {
                if !plans.contains(&chosen) {
                    plans.push(chosen);
                }
            }
        }
        let eps = 1e-6f32;
        for plan in plans {
            let ty = TYPES[rng.gen_range(0..TYPES.len())];
            let n_rows = rng.gen_range(37..300usize);
            let n_cols = 32 * rng.gen_range(3..40usize) * ty.block_size().div_ceil(32);
            let what = format!("{plan:?} {ty} {n_rows}x{n_cols}, seed {seed}");
            let wq = random_weights(&mut rng, ty, n_rows, n_cols);
            let uq = random_weights(&mut rng, ty, n_rows, n_cols);
            let (wb, ub) = (buffer_with(&ctx, "w", &wq), buffer_with(&ctx, "u", &uq));
            let mut vec = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
                (0..n).map(|_| rng.gen_range(lo..hi)).collect()
            };
            // a residual stream, a block's output on another scale, and the two norms' weights
            let (x, p) = (vec(n_cols, -1.0, 1.0), vec(n_cols, -8.0, 8.0));
            let (g, gp) = (vec(n_cols, 0.5, 1.5), vec(n_cols, -2.0, 2.0));
            let (xb, pb, gb, gpb) = (
                with(&ctx, "x", &x),
                with(&ctx, "p", &p),
                with(&ctx, "g", &g),
                with(&ctx, "gp", &gp),
            );
            let mut post = vec![0f32; n_cols];
            crate::rms_norm_ref(&p, &gp, &mut post, n_cols, eps);
            let settled: Vec<f32> = x.iter().zip(&post).map(|(a, b)| a + b).collect();
            let mut normed = vec![0f32; n_cols];
            crate::rms_norm_ref(&settled, &g, &mut normed, n_cols, eps);
            let w = |data| QWeightRef {
                ty,
                data,
                n_rows: n_rows as u32,
                n_cols: n_cols as u32,
            };
            let (ws, us, gs, ps, gps) =
                (wb.whole(), ub.whole(), gb.whole(), pb.whole(), gpb.whole());
            // the single-token product of `input` (as the kernel sees it) with the fused norm
            // and, where given, a pending post-norm, against the reference
            let product = |pending: Option<PendingNorm>, input: &[f32], case: &str| {
                let yb = poisoned(&ctx, "y", n_rows);
                let args = LinearArgs {
                    w: w(&ws),
                    x: &xb.whole(),
                    y: &yb.whole(),
                    n_tokens: 1,
                    y_stride: n_rows as u32,
                    y_col: 0,
                    bias: None,
                    accumulate: false,
                    norm: Some((&gs, eps)),
                    pending,
                };
                let mut chain = Chain::new(&ctx).unwrap();
                lin.record_with(&mut chain, &args, Some(plan)).unwrap();
                chain.run().unwrap();
                let mut want = vec![0f32; n_rows];
                linear_ref(
                    ty, &wq, n_rows, n_cols, input, 1, &mut want, n_rows, 0, None, false,
                )
                .unwrap();
                if let Err(e) = check_close(&read(&ctx, &yb, n_rows), &want, REL) {
                    panic!("{what} ({case}): {e}");
                }
            };
            // the plain fused norm in the same layout
            let mut plain = vec![0f32; n_cols];
            crate::rms_norm_ref(&x, &g, &mut plain, n_cols, eps);
            product(None, &plain, "fused norm");
            let sb = poisoned(&ctx, "settled", n_cols);
            let ss = sb.whole();
            let pending = |settle| {
                Some(PendingNorm {
                    p: &ps,
                    weight: &gps,
                    settle,
                })
            };
            product(pending(Some(&ss)), &normed, "pending post-norm");
            if let Err(e) = crate::check_close_sum(&read(&ctx, &sb, n_cols), &x, &post, 1e-5) {
                panic!("{what} (settled stream): {e}");
            }
            // the fused GLU, not settling
            let yb = poisoned(&ctx, "y", n_rows);
            let args = LinearGluArgs {
                gate: w(&ws),
                up: w(&us),
                x: &xb.whole(),
                y: &yb.whole(),
                n_tokens: 1,
                op: GluOp::GeluTanh,
                norm: Some((&gs, eps)),
                pending: pending(None),
            };
            let mut chain = Chain::new(&ctx).unwrap();
            lin.record_glu_with(&mut chain, &args, Some(plan)).unwrap();
            chain.run().unwrap();
            let mut want = vec![0f32; n_rows];
            let op = GluOp::GeluTanh;
            linear_glu_ref(ty, &wq, &uq, n_rows, n_cols, &normed, 1, &mut want, op).unwrap();
            if let Err(e) = check_close(&read(&ctx, &yb, n_rows), &want, REL) {
                panic!("{what} (GLU, pending post-norm): {e}");
            }
        }
        assert_no_validation_errors(&ctx);
    }

    /// A pending post-norm without the fused norm, on more than one token, or settling onto what
    /// the dispatch reads, is a clear error.
    #[test]
    fn pending_post_norm_misuse_is_a_clear_error() {
        use crate::operand::test_bufs::{poisoned, with};
        let Some(ctx) = gpu_or_skip("matvec_pending_misuse") else {
            return;
        };
        let lin = Linear::with_layout(&ctx, false).unwrap();
        let (n_rows, n_cols) = (64usize, 128usize);
        let mut rng = StdRng::seed_from_u64(7);
        let wq = random_weights(&mut rng, GgmlType::Q8_0, n_rows, n_cols);
        let wb = buffer_with(&ctx, "w", &wq);
        let ones = vec![1f32; 2 * n_cols];
        let (xb, pb, gb) = (
            with(&ctx, "x", &ones),
            with(&ctx, "p", &ones),
            with(&ctx, "g", &ones),
        );
        let yb = poisoned(&ctx, "y", 2 * n_rows);
        let (ws, xs, ps, gs, ys) = (wb.whole(), xb.whole(), pb.whole(), gb.whole(), yb.whole());
        let run = |n_tokens: u32, norm: bool, settle: Option<&BufferSlice>| {
            let args = LinearArgs {
                w: QWeightRef {
                    ty: GgmlType::Q8_0,
                    data: &ws,
                    n_rows: n_rows as u32,
                    n_cols: n_cols as u32,
                },
                x: &xs,
                y: &ys,
                n_tokens,
                y_stride: n_rows as u32,
                y_col: 0,
                bias: None,
                accumulate: false,
                norm: norm.then_some((&gs, 1e-6)),
                pending: Some(PendingNorm {
                    p: &ps,
                    weight: &gs,
                    settle,
                }),
            };
            let mut chain = Chain::new(&ctx).unwrap();
            lin.record(&mut chain, &args).map_err(|e| e.to_string())
        };
        assert!(run(1, true, None).is_ok());
        let e = run(1, false, None).unwrap_err();
        assert!(e.contains("needs the fused norm"), "{e}");
        let e = run(2, true, None).unwrap_err();
        assert!(e.contains("one token"), "{e}");
        let e = run(1, true, Some(&xs)).unwrap_err();
        assert!(e.contains("must not overlap"), "{e}");
    }

    /// A layout that does not fit the tokens or the device is a clear error, not a wrong result.
    #[test]
    fn gpu_matvec_bad_layouts_are_errors() {
        let Some(ctx) = gpu_or_skip("matvec_bad_layouts") else {
            return;
        };
        let lin = Linear::with_layout(&ctx, false).unwrap();
        let wb = buffer_with(&ctx, "w", &vec![0u8; 4 * 64 * 64]);
        let xb = buffer_with(&ctx, "x", &[0u8; 4 * 64 * 4]);
        let yb = buffer_with(&ctx, "y", &[0u8; 4 * 64 * 4]);
        let args = LinearArgs {
            w: QWeightRef {
                ty: GgmlType::F32,
                data: &wb.whole(),
                n_rows: 64,
                n_cols: 64,
            },
            x: &xb.whole(),
            y: &yb.whole(),
            n_tokens: 4,
            y_stride: 64,
            y_col: 0,
            bias: None,
            accumulate: false,
            norm: None,
            pending: None,
        };
        let base = MatvecPlan::DEFAULT;
        for plan in [
            MatvecPlan { maxt: 2, ..base },
            MatvecPlan { tpr: 48, ..base },
            MatvecPlan {
                wg: 96,
                tpr: 64,
                ..base
            },
            MatvecPlan { rpt: 0, ..base },
            MatvecPlan {
                wg: 1 << 20,
                ..base
            },
        ] {
            let mut chain = Chain::new(&ctx).unwrap();
            let err = lin.record_with(&mut chain, &args, Some(plan));
            assert!(
                matches!(err, Err(KernelError::Shape { .. })),
                "{plan:?}: {:?}",
                err.err()
            );
        }
    }

    /// The worst `check_close` error of `got` against `want` (the measure its bound applies to).
    fn worst_rel(got: &[f32], want: &[f32]) -> f32 {
        let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
        got.iter()
            .zip(want)
            .map(|(&g, &w)| (g - w).abs() / w.abs().max(0.01 * scale).max(f32::MIN_POSITIVE))
            .fold(0f32, f32::max)
    }

    /// The fused GLU of `ty` through both layouts: 1, 3 and 8 tokens, both activations, with
    /// and without a fused norm (GPU layout: the CPU-driver one has none).
    fn check_glu_type(ty: GgmlType) {
        for cpu in [false, true] {
            check_glu_layout(ty, cpu);
        }
    }

    /// Random gate and up matrices of `ty` and random inputs through the GPU (`cpu` false) or
    /// CPU-driver kernels, against [`linear_glu_ref`]; y poisoned with NaN, past its end too.
    /// The activation is applied to a product of ~1e-6 relative error and multiplies another:
    /// the linear bound [`REL`] holds (SiLU/GELU have derivatives of at most ~1.1 in magnitude).
    fn check_glu_layout(ty: GgmlType, cpu: bool) {
        use crate::operand::test_bufs::{poisoned, read, with};
        let Some(ctx) = gpu_or_skip(&format!("linear_glu_{ty}")) else {
            return;
        };
        if cpu && !cpu_layout_runs(&ctx) {
            println!("linear_glu_{ty}: CPU-driver layout skipped (no 8-wide subgroups)");
            return;
        }
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let lin = Linear::with_layout(&ctx, cpu).unwrap();
        let n_rows = rng.gen_range(96..300usize);
        let n_cols = random_cols(&mut rng, ty);
        let gq = random_weights(&mut rng, ty, n_rows, n_cols);
        let uq = random_weights(&mut rng, ty, n_rows, n_cols);
        let (gb, ub) = (buffer_with(&ctx, "gate", &gq), buffer_with(&ctx, "up", &uq));
        let nw: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(0.5..1.5)).collect();
        let nb = with(&ctx, "norm", &nw);
        let eps = 1e-6f32;
        let mut worst = 0f32;
        for n_tokens in [1usize, 3, 8] {
            assert!(lin.fuses_glu(n_tokens as u32, ty, ty));
            let x: Vec<f32> = (0..n_tokens * n_cols)
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            let xb = with(&ctx, "x", &x);
            let len = n_tokens * n_rows;
            // where batches of this size go to the cooperative-matrix kernel (its own tests),
            // the matvec kernel is asked for by its layout
            let plan = lin
                .uses_coop(n_tokens as u32)
                .then(|| MatvecPlan::choose_glu(n_rows as u32, n_cols as u32, n_tokens as u32));
            for op in [GluOp::Silu, GluOp::GeluTanh] {
                for fused in [false, true] {
                    if fused && !lin.fuses_norm(n_tokens as u32) && plan.is_none() {
                        continue;
                    }
                    // 5 floats past y's end must stay NaN
                    let yb = poisoned(&ctx, "y", len + 5);
                    let ns = nb.whole();
                    let args = LinearGluArgs {
                        gate: QWeightRef {
                            ty,
                            data: &gb.whole(),
                            n_rows: n_rows as u32,
                            n_cols: n_cols as u32,
                        },
                        up: QWeightRef {
                            ty,
                            data: &ub.whole(),
                            n_rows: n_rows as u32,
                            n_cols: n_cols as u32,
                        },
                        x: &xb.whole(),
                        y: &yb.slice(0, 4 * len as u64).unwrap(),
                        n_tokens: n_tokens as u32,
                        op,
                        norm: fused.then_some((&ns, eps)),
                        pending: None,
                    };
                    let mut chain = Chain::new(&ctx).unwrap();
                    lin.record_glu_with(&mut chain, &args, plan).unwrap();
                    chain.run().unwrap();
                    let got = read(&ctx, &yb, len + 5);
                    let x_in = if fused {
                        let mut h = vec![0f32; x.len()];
                        crate::rms_norm_ref(&x, &nw, &mut h, n_cols, eps);
                        h
                    } else {
                        x.clone()
                    };
                    let mut want = vec![0f32; len];
                    linear_glu_ref(ty, &gq, &uq, n_rows, n_cols, &x_in, n_tokens, &mut want, op)
                        .unwrap();
                    let what = format!(
                        "fused GLU {ty} {op:?} (cpu layout {cpu}, fused norm {fused}) \
                        {n_rows}x{n_cols}, {n_tokens} tokens, seed {seed}"
                    );
                    if let Err(e) = check_close(&got[..len], &want, REL) {
                        panic!("{what}: {e}");
                    }
                    assert!(
                        got[len..].iter().all(|v| v.is_nan()),
                        "{what}: written past y's end"
                    );
                    worst = worst.max(worst_rel(&got[..len], &want));
                }
            }
        }
        println!(
            "linear_glu_{ty} (cpu layout {cpu}) {n_rows}x{n_cols}: worst relative error {worst:.2e}"
        );
        assert_no_validation_errors(&ctx);
    }

    macro_rules! glu_type_tests {
        ($($name:ident => $ty:ident),*) => {$(
            #[test]
            fn $name() {
                check_glu_type(GgmlType::$ty);
            }
        )*};
    }

    glu_type_tests!(
        gpu_linear_glu_f32 => F32, gpu_linear_glu_f16 => F16, gpu_linear_glu_q4_0 => Q4_0,
        gpu_linear_glu_q4_1 => Q4_1, gpu_linear_glu_q5_0 => Q5_0, gpu_linear_glu_q5_1 => Q5_1,
        gpu_linear_glu_q8_0 => Q8_0, gpu_linear_glu_q4_k => Q4_K, gpu_linear_glu_q5_k => Q5_K,
        gpu_linear_glu_q6_k => Q6_K
    );

    #[test]
    fn fused_glu_mismatches_are_clear_errors() {
        let Some(ctx) = gpu_or_skip("linear_glu_mismatches") else {
            return;
        };
        let big = Buffer::new(&ctx, "big", 1 << 20, MemoryKind::DeviceLocal).unwrap();
        let small = Buffer::new(&ctx, "small", 64, MemoryKind::DeviceLocal).unwrap();
        let (bw, sw) = (big.whole(), small.whole());
        let w = |ty, n_rows, data| QWeightRef {
            ty,
            data,
            n_rows,
            n_cols: 64,
        };
        let layouts = if cpu_layout_runs(&ctx) {
            vec![false, true]
        } else {
            vec![false]
        };
        for cpu in layouts {
            let lin = Linear::with_layout(&ctx, cpu).unwrap();
            let run = |gate, up, n_tokens, norm| {
                let a = LinearGluArgs {
                    gate,
                    up,
                    x: &bw,
                    y: &bw,
                    n_tokens,
                    op: GluOp::Silu,
                    norm,
                    pending: None,
                };
                let mut chain = Chain::new(&ctx).unwrap();
                lin.record_glu(&mut chain, &a).unwrap_err().to_string()
            };
            let q8 = GgmlType::Q8_0;
            let e = run(w(q8, 8, &bw), w(q8, 16, &bw), 1, None);
            assert!(e.contains("gate is 8x64 and up 16x64"), "{e}");
            let e = run(w(q8, 8, &bw), w(GgmlType::Q4_0, 8, &bw), 1, None);
            assert!(e.contains("gate is Q8_0 and up Q4_0"), "{e}");
            if lin.uses_coop(9) {
                // batches on cooperative matrices fuse too, but without a norm
                let e = run(w(q8, 8, &bw), w(q8, 8, &bw), 9, Some((&bw, 1e-6)));
                assert!(e.contains("fused norm needs the matvec kernel"), "{e}");
            } else {
                let e = run(w(q8, 8, &bw), w(q8, 8, &bw), 9, None);
                assert!(e.contains("9 tokens") && e.contains("1..=8"), "{e}");
            }
            let e = run(w(q8, 8, &bw), w(q8, 8, &sw), 2, None);
            assert!(e.contains("up weights (small)"), "{e}");
            let e = run(
                w(GgmlType::Q2_K, 8, &bw),
                w(GgmlType::Q2_K, 8, &bw),
                2,
                None,
            );
            assert!(e.contains("Q2_K") && e.contains("not supported"), "{e}");
            if cpu {
                let e = run(w(q8, 8, &bw), w(q8, 8, &bw), 2, Some((&bw, 1e-6)));
                assert!(e.contains("fused norm"), "{e}");
            } else {
                let e = run(w(q8, 8, &bw), w(q8, 8, &bw), 2, Some((&sw, 1e-6)));
                assert!(e.contains("norm (small)"), "{e}");
            }
            assert!(lin.fuses_glu(8, q8, q8) && lin.fuses_glu(1, q8, q8));
            assert_eq!(lin.fuses_glu(9, q8, q8), lin.uses_coop(9));
            assert!(!lin.fuses_glu(0, q8, q8));
            assert!(!lin.fuses_glu(1, q8, GgmlType::Q4_0));
            assert!(!lin.fuses_glu(1, GgmlType::Q2_K, GgmlType::Q2_K));
        }
    }

    #[test]
    fn bad_shapes_and_types_are_clear_errors() {
        let Some(ctx) = gpu_or_skip("linear_bad_shapes") else {
            return;
        };
        let lin = Linear::new(&ctx).unwrap();
        let big = Buffer::new(&ctx, "big", 1 << 20, MemoryKind::DeviceLocal).unwrap();
        let small = Buffer::new(&ctx, "small", 64, MemoryKind::DeviceLocal).unwrap();
        let (bw, sw) = (big.whole(), small.whole());
        let args = |ty, n_cols, x: &'static str| {
            let xs = if x == "small" { &sw } else { &bw };
            let a = LinearArgs {
                w: QWeightRef {
                    ty,
                    data: &bw,
                    n_rows: 8,
                    n_cols,
                },
                x: xs,
                y: &bw,
                n_tokens: 3,
                y_stride: 8,
                y_col: 0,
                bias: None,
                accumulate: false,
                norm: None,
                pending: None,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            lin.record(&mut chain, &a)
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        let e = args(GgmlType::Q4_K, 300, "big");
        assert!(e.contains("300") && e.contains("256"), "{e}");
        let e = args(GgmlType::Q2_K, 256, "big");
        assert!(e.contains("Q2_K") && e.contains("not supported"), "{e}");
        let e = args(GgmlType::Q8_0, 64, "small");
        assert!(e.contains("x (small)") && e.contains("192 floats"), "{e}");
        assert!(!Linear::supports(GgmlType::Q2_K) && Linear::supports(GgmlType::Q6_K));
        let a = LinearArgs {
            w: QWeightRef {
                ty: GgmlType::F32,
                data: &bw,
                n_rows: 8,
                n_cols: 4,
            },
            x: &bw,
            y: &bw,
            n_tokens: 2,
            y_stride: 9,
            y_col: 2,
            bias: Some(&sw),
            accumulate: false,
            norm: None,
            pending: None,
        };
        let mut chain = Chain::new(&ctx).unwrap();
        let e = lin.record(&mut chain, &a).unwrap_err().to_string();
        assert!(e.contains("y_stride 9 < y_col 2 + n_rows 8"), "{e}");
    }
}
