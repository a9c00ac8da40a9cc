//! Linear layers on GGUF-encoded weights: `y[t, y_col + r] (=|+=) dot(W row r, x[t]) (+ bias[r])`
//! (shaders `matvec.comp` for a few tokens, `matmul.comp` for batches, or `matmul_coop.comp` on
//! devices with cooperative matrices — see [`crate::matmul_coop`]; weight decoding in
//! `quant.glsl`).
//!
//! Weights stay on the device in their exact GGUF bytes: `n_rows` rows of `n_cols` elements,
//! row `r` at byte `r * row_bytes` with `row_bytes = quantized_size(ty, n_cols)`. Types
//! ([`Linear::weight_types`]): F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, IQ4_NL,
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS.
//!
//! On CPU drivers (lavapipe) both products use `linear_cpu.comp` instead, a layout without
//! shared memory whose x reads are subgroup-uniform (see the shader's header).
//!
//! [`Linear::record_glu`] fuses an FFN's gated linear unit for a few tokens: both products of
//! the gate and up matrices and `act(gate) * up` in one dispatch (the `GLU` variants of
//! `matvec.comp` and `linear_cpu.comp`), one barrier stage and two dispatches fewer per layer
//! than two matvecs, a barrier and [`crate::Glu`].

//!
//! # The linear family
//!
//! This folder holds the products on GGUF weights and what they are made of: the matvec work
//! layouts (`plan.rs`), the operands and their checks (`args.rs`), the fused gate/up/activation
//! (`glu.rs`), the CPU references (`reference.rs`), the cooperative-matrix matmul with its
//! split-K sum (`matmul_coop.rs`, `split_sum.rs`), the per-type shader lookup (`qweight.rs`),
//! row lookups of the same encodings (`get_rows.rs`) and the LoRA products (`lora.rs`). Their
//! shaders are in `shaders/linear/`.

mod args;
#[cfg(test)]
mod fused_tests;
pub mod get_rows;
mod glu;
pub mod lora;
pub mod matmul_coop;
mod matvec_dot;
mod plan;
pub(crate) mod qweight;
mod reference;
pub mod split_sum;
#[cfg(test)]
mod tests;

pub(crate) use args::{check_args, glu_cost, product_cost, Checked};
pub use args::{LinearArgs, LinearGluArgs, PendingNorm, QWeightRef};
use matvec_dot::DOT_MAX_ROWS;
pub use matvec_dot::{
    matvec_dot_glu_ref, matvec_dot_ref, q8_blocks, q8_words, quantize_q8_ref, MATVEC_DOT_MAX_COLS,
};
pub(crate) use plan::MatvecPlan;
pub use reference::{linear_glu_ref, linear_ref};

use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Context, DeviceKind, Pipeline, PipelineDesc, Push, VkError};

use crate::error::{KernelError, Result};
use crate::spec::SpecPipelines;
use crate::tuning::Tuning;
use args::check_pending;
use matmul_coop::MatmulCoop;
pub(crate) use matvec_dot::record_quantize_q8;
use matvec_dot::{DotInput, MatvecDot};
use plan::{cpu_groups, Matvec};
use qweight::{check_words, QOp, TYPES};

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
/// [`MATVEC_MAX_TOKENS`]. The default of [`crate::Tuning::coop_min_tokens`]: the
/// cooperative-matrix product costs about the same from 1 to 64 tokens (its tiles pad to 64),
/// while the matvec kernel's cost grows with its tokens and crosses it between 4 and 8
/// (docs/perf-log/kernel-comment-notes.md).
pub const COOP_MIN_TOKENS: u32 = 5;

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
    /// Batches of [`Tuning::coop_min_tokens`] or more go here when present.
    coop: Option<MatmulCoop>,
    /// One-token K-quant products on integer dot products (either layout, where the device
    /// has them); taken where [`Tuning::matvec_dot`] and [`MatvecDot::fits`] say so.
    dot: Option<MatvecDot>,
    /// Read once at construction; see [`Linear::tuning`].
    tuning: Tuning,
}

impl Linear {
    /// Builds every type's pipelines. The matvec reduction needs a subgroup size dividing 32:
    /// devices whose subgroups may be wider get 32 required, or an error without size control.
    /// CPU drivers whose subgroups are (or can be made) 8 wide get the `linear_cpu.comp`
    /// variants.
    /// The tuning is the device's ([`Tuning::for_device`]: its defaults and the environment's
    /// measurement switches, read here once).
    pub fn new(ctx: &Context) -> Result<Self> {
        Self::with_tuning(ctx, Tuning::for_device(ctx.caps()))
    }

    /// [`Linear::new`] with a given tuning (tests and benchmarks set it without the
    /// environment).
    pub fn with_tuning(ctx: &Context, tuning: Tuning) -> Result<Self> {
        let cpu = ctx.caps().kind == DeviceKind::Cpu && cpu_layout_runs(ctx);
        Self::with_layout(ctx, cpu, tuning)
    }

    /// The GPU kernels even on a CPU driver, where [`Linear::new`] picks the CPU-driver ones:
    /// tests of the GPU-only paths (fused norms, the fused GLU with its norm) on lavapipe.
    pub fn with_gpu_layout(ctx: &Context) -> Result<Self> {
        Self::with_layout(ctx, false, Tuning::for_device(ctx.caps()))
    }

    /// What this instance was built with: where batches take the cooperative-matrix kernel,
    /// how products split, and the measurement switches recordings consult.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// Builds the CPU-driver variants when `cpu`, else the GPU ones (tests run both anywhere).
    pub(crate) fn with_layout(ctx: &Context, cpu: bool, tuning: Tuning) -> Result<Self> {
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
                    let mut desc = PipelineDesc::new(op.variant(i), bindings, push);
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
                // off by default here (not accelerated on CPU drivers), built for tunings that
                // ask for it
                dot: MatvecDot::new(ctx, required)?,
                tuning,
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
            let (mv, glu) = (QOp::Matvec.variant(i), QOp::MatvecGlu.variant(i));
            matvec.push(Matvec::Spec(
                SpecPipelines::new(mv, MATVEC_BINDINGS, MATVEC_PUSH_BYTES, mv.name)
                    .subgroup_size(required),
            ));
            matvec_glu.push(Matvec::Spec(
                SpecPipelines::new(glu, MATVEC_BINDINGS + 1, MATVEC_PUSH_BYTES + 4, glu.name)
                    .subgroup_size(required),
            ));
            let desc = PipelineDesc::new(QOp::Matmul.variant(i), 4, PUSH_BYTES);
            matmul.push(Pipeline::new(ctx, &desc)?);
        }
        let coop = if MatmulCoop::supported(ctx.caps()) {
            Some(MatmulCoop::with_tuning(ctx, &tuning)?)
        } else {
            None
        };
        Ok(Linear {
            matvec,
            matvec_glu,
            matmul,
            cpu,
            coop,
            dot: MatvecDot::new(ctx, required)?,
            tuning,
        })
    }

    /// The same kernels with type `ty`'s single-token matvec and GLU pipelines built from other
    /// `matvec.comp` variants (benchmark experiments of `variants.txt`).
    #[cfg(all(test, feature = "bench"))]
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

    /// The same kernels with type `ty`'s integer-dot pipelines (plain or `glu`) built from
    /// another variant of `matvec_dot.comp` (benchmarks compare them); `None` where the device
    /// has no integer dot products.
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

    /// The same kernels without the cooperative-matrix path (benchmarks compare the two).
    #[cfg(all(test, feature = "bench"))]
    pub(crate) fn without_coop(mut self) -> Self {
        self.coop = None;
        self
    }

    /// Whether a batch of `n_tokens` runs on the cooperative-matrix kernel, whose products
    /// are of f16-rounded weights and inputs ([`crate::matmul_coop::matmul_coop_ref`]) — for
    /// a step whose rows do not all sample (prompts: see [`Linear::step`]).
    pub fn uses_coop(&self, n_tokens: u32) -> bool {
        self.step(false).uses_coop(n_tokens)
    }

    /// Whether a batch of `n_tokens` (2 ..= [`MATVEC_MAX_TOKENS`]) of a step whose rows do not
    /// all sample stays off the cooperative-matrix kernel for the integer-dot one
    /// ([`Tuning::dot_batches`]), except for vocabulary-sized products (see `dot_for`).
    pub fn dot_batch(&self, n_tokens: u32) -> bool {
        self.step(false).dot_batch(n_tokens)
    }

    /// Whether a batch of `n_tokens` can take [`LinearArgs::norm`] (the GPU matvec kernel).
    pub fn fuses_norm(&self, n_tokens: u32) -> bool {
        self.step(false).fuses_norm(n_tokens)
    }

    /// Whether [`Linear::record_glu`] takes a batch of `n_tokens` with gate and up matrices of
    /// these types: a batch for the cooperative-matrix kernel ([`Linear::uses_coop`]) or else
    /// 1 ..= [`MATVEC_MAX_TOKENS`] tokens (the matvec path), and one supported type for both. The
    /// matrices must also have the same shape (`record_glu` checks it).
    pub fn fuses_glu(&self, n_tokens: u32, gate_ty: GgmlType, up_ty: GgmlType) -> bool {
        self.step(false).fuses_glu(n_tokens, gate_ty, up_ty)
    }

    /// The products as a step's rows take them: `decode` where every row of the step samples
    /// a token (several sequences' decode rows), which [`crate::DotBatches::Decode`] sends to the
    /// 8-bit dot products; [`Linear`]'s own methods are those of a step that is not.
    pub fn step(&self, decode: bool) -> StepLinear<'_> {
        StepLinear { lin: self, decode }
    }

    /// Whether a batch of `n_tokens` takes the fused gate/up/activation of the
    /// cooperative-matrix kernel.
    fn coop_glu(&self, n_tokens: u32, decode: bool) -> bool {
        self.step(decode).uses_coop(n_tokens) && self.coop.as_ref().is_some_and(|c| c.glu.is_some())
    }

    /// Whether a layout given for the matvec kernel (benchmarks and tests comparing layouts)
    /// takes this batch to it even where the cooperative-matrix kernel would take it.
    fn forces_matvec(&self, plan: Option<MatvecPlan>, n_tokens: u32) -> bool {
        plan.is_some() && !self.cpu && (1..=MATVEC_MAX_TOKENS).contains(&n_tokens)
    }

    /// A fused norm needs the matvec kernel: refuses a batch that goes elsewhere (unless a
    /// matvec layout was `forced`).
    fn check_norm_path(&self, n_tokens: u32, forced: bool, decode: bool) -> Result<()> {
        if self.step(decode).fuses_norm(n_tokens) || forced {
            return Ok(());
        }
        let coop_min = self.tuning.coop_min_tokens;
        Err(KernelError::Shape {
            op: OP,
            detail: format!(
                "a fused norm needs the matvec kernel (GPU layout; at most {MATVEC_MAX_TOKENS} tokens, fewer than {coop_min} with cooperative matrices)"
            ),
        })
    }

    /// The integer-dot kernel where it takes this product (`glu`: the fused gate/up; `shape`:
    /// rows and columns): the tuning asks for it, no matvec layout was given (`forced`),
    /// [`MatvecDot::fits`] the weights `w` of type `ty`, and it is not a batch's
    /// vocabulary-sized product on a device with cooperative matrices (each of its many
    /// workgroups quantizes the whole batch's x: the tiles are faster there); `decode` as for
    /// [`Linear::step`].
    #[allow(clippy::too_many_arguments)]
    fn dot_for(
        &self,
        ty: GgmlType,
        glu: bool,
        [n_rows, n_cols]: [u32; 2],
        n_tokens: u32,
        pending: bool,
        w: &[&BufferSlice],
        forced: bool,
        decode: bool,
    ) -> Option<&MatvecDot> {
        let tall = n_tokens > 1 && n_rows >= DOT_MAX_ROWS && self.coop.is_some();
        self.dot.as_ref().filter(|d| {
            !forced
                && !tall
                && MatvecDot::takes(
                    &self.tuning,
                    ty,
                    u64::from(n_rows) * u64::from(n_cols),
                    n_tokens,
                    decode,
                )
                && d.fits(ty, glu, n_cols, n_tokens, pending, w)
        })
    }

    /// Whether the kernels read weights of type `ty`.
    pub fn supports(ty: GgmlType) -> bool {
        TYPES.contains(&ty)
    }

    /// The weight types the kernels read (every product path, the GLU, `GetRows` and
    /// `LinearT` take the same ones).
    pub fn weight_types() -> &'static [GgmlType] {
        &TYPES
    }

    /// Records `y (=|+=) x · Wᵀ (+ bias)`: the cooperative-matrix kernel for batches of
    /// [`Tuning::coop_min_tokens`] or more where the device has it, else the matvec kernel for
    /// `n_tokens <=` [`MATVEC_MAX_TOKENS`], the tiled matmul above. Checks the type, the shapes and every
    /// operand's size. `y` must not alias `x`, `bias` or the weights.
    pub fn record(&self, chain: &mut Chain, a: &LinearArgs) -> Result<()> {
        self.record_with(chain, a, None)
    }

    /// [`Linear::record`] without the cooperative-matrix kernel: f32 products for any batch
    /// (the matvec, or the tiled matmul past [`MATVEC_MAX_TOKENS`]). For products whose
    /// results are compared rather than summed on — a mixture of experts' router, whose top-k
    /// must not flip where f16-rounded operands would move two close logits.
    pub fn record_f32(&self, chain: &mut Chain, a: &LinearArgs) -> Result<()> {
        self.record_inner(chain, a, None, false, false, None)
    }

    /// [`Linear::record`], the GPU matvec in the work layout `plan` where given (benchmarks and
    /// tests compare layouts), else in [`MatvecPlan::choose`]'s.
    pub(crate) fn record_with(
        &self,
        chain: &mut Chain,
        a: &LinearArgs,
        plan: Option<MatvecPlan>,
    ) -> Result<()> {
        self.record_inner(chain, a, plan, true, false, None)
    }

    /// [`Linear::record_with`], the cooperative-matrix kernel allowed where `allow_coop`, for
    /// a step of `decode` rows ([`Linear::step`]); `xq`: x's 8-bit codes already quantized for
    /// the integer-dot kernel (which must take the product).
    #[allow(clippy::too_many_arguments)]
    fn record_inner(
        &self,
        chain: &mut Chain,
        a: &LinearArgs,
        plan: Option<MatvecPlan>,
        allow_coop: bool,
        decode: bool,
        xq: Option<&BufferSlice>,
    ) -> Result<()> {
        let Checked { ti, push, bindings } = check_args(a)?;
        let forced = self.forces_matvec(plan, a.n_tokens);
        let plan = plan.unwrap_or_else(|| {
            let (r, c, t) = (a.w.n_rows, a.w.n_cols, a.n_tokens);
            if a.pending.is_some() {
                MatvecPlan::choose_direct(r, c, t)
            } else {
                MatvecPlan::blocks_fit(a.w.ty, c, t, &[a.w.data])
                    .then(|| MatvecPlan::blocks(r, c, a.norm.is_some()))
                    .flatten()
                    .unwrap_or_else(|| MatvecPlan::choose(r, c, t))
            }
        });
        let w = &a.w;
        if a.pending.is_some() && a.norm.is_none() {
            return Err(KernelError::Shape {
                op: OP,
                detail: "a pending post-norm needs the fused norm".into(),
            });
        }
        if let Some((g, _)) = a.norm {
            self.check_norm_path(a.n_tokens, forced, decode)?;
            check_words(OP, "norm", g, u64::from(w.n_cols), "floats")?;
        }
        // a given layout, and record_f32's products (of f32 x, not of its 8-bit codes), keep
        // the matvec
        let given = forced || !allow_coop;
        if let Some(dot) = self.dot_for(
            w.ty,
            false,
            [w.n_rows, w.n_cols],
            a.n_tokens,
            a.pending.is_some(),
            &[w.data],
            given,
            decode,
        ) {
            let input = match xq {
                Some(q) => DotInput::Quantized(q),
                None if self.tuning.quantize_once => DotInput::Once,
                None => DotInput::Workgroups,
            };
            return dot.record(chain, a, &bindings, push, input);
        }
        if xq.is_some() {
            return Err(KernelError::Shape {
                op: OP,
                detail: "x quantized for the integer-dot kernel, which does not take this product"
                    .into(),
            });
        }
        if let Some((g, eps)) = a.norm {
            return self.record_matvec(chain, ti, a, &bindings, push, plan, Some((g, eps)));
        }
        // a dot batch's vocabulary-sized product (which the dot kernel leaves) keeps the
        // cooperative-matrix kernel
        let step = self.step(decode);
        let coop_here =
            step.uses_coop(a.n_tokens) || (step.dot_batch(a.n_tokens) && w.n_rows >= DOT_MAX_ROWS);
        if let Some(coop) = self
            .coop
            .as_ref()
            .filter(|_| allow_coop && coop_here && !forced)
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
        check_blocks(plan, &a.w, a.n_tokens, &[a.w.data])?;
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
/// The linear kernels as the rows of one kind of step take them ([`Linear::step`]).
#[derive(Clone, Copy)]
pub struct StepLinear<'a> {
    lin: &'a Linear,
    /// Every row of the step samples a token.
    decode: bool,
}

impl StepLinear<'_> {
    /// Whether a batch of `n_tokens` runs on the cooperative-matrix kernel, whose products
    /// are of f16-rounded weights and inputs ([`crate::matmul_coop::matmul_coop_ref`]).
    pub fn uses_coop(&self, n_tokens: u32) -> bool {
        let l = self.lin;
        l.coop.is_some() && n_tokens >= l.tuning.coop_min_tokens && !self.dot_batch(n_tokens)
    }

    /// Whether a batch of `n_tokens` (2 ..= [`MATVEC_MAX_TOKENS`]) stays off the
    /// cooperative-matrix kernel for the integer-dot one ([`Tuning::dot_batches`]), except for
    /// vocabulary-sized products (see `dot_for`).
    pub fn dot_batch(&self, n_tokens: u32) -> bool {
        let l = self.lin;
        l.tuning.dot_batches.takes(self.decode)
            && l.dot.is_some()
            && (2..=MATVEC_MAX_TOKENS).contains(&n_tokens)
    }

    /// Whether a batch of `n_tokens` can take [`LinearArgs::norm`] (the GPU matvec kernel).
    pub fn fuses_norm(&self, n_tokens: u32) -> bool {
        !self.lin.cpu && n_tokens <= MATVEC_MAX_TOKENS && !self.uses_coop(n_tokens)
    }

    /// [`Linear::fuses_glu`] for this step's rows.
    pub fn fuses_glu(&self, n_tokens: u32, gate_ty: GgmlType, up_ty: GgmlType) -> bool {
        let path =
            (1..=MATVEC_MAX_TOKENS).contains(&n_tokens) || self.lin.coop_glu(n_tokens, self.decode);
        path && gate_ty == up_ty && Linear::supports(gate_ty)
    }

    /// [`Linear::record`] for this step's rows.
    pub fn record(&self, chain: &mut Chain, a: &LinearArgs) -> Result<()> {
        self.lin
            .record_inner(chain, a, None, true, self.decode, None)
    }

    /// [`StepLinear::record`] of several products of one input (the same x, tokens, columns
    /// and fused norm: a block's Q, K and V, or a matrix's row pieces), recorded alike for the
    /// caller's barrier after them. Where [`Tuning::quantize_once`] holds and every one takes
    /// the integer-dot kernel, their x is quantized once for all of them.
    pub fn record_many(&self, chain: &mut Chain, args: &[LinearArgs]) -> Result<()> {
        let l = self.lin;
        let Some(first) = args.first() else {
            return Ok(());
        };
        let same_norm = |a: &LinearArgs| match (a.norm, first.norm) {
            (None, None) => true,
            (Some((g, e)), Some((g0, e0))) => slice_eq(g, g0) && e.to_bits() == e0.to_bits(),
            _ => false,
        };
        let shared = |a: &LinearArgs| {
            slice_eq(a.x, first.x)
                && (a.n_tokens, a.w.n_cols) == (first.n_tokens, first.w.n_cols)
                && same_norm(a)
        };
        let takes_dot = |a: &LinearArgs| {
            let shape = [a.w.n_rows, a.w.n_cols];
            let pending = a.pending.is_some();
            l.dot_for(
                a.w.ty,
                false,
                shape,
                a.n_tokens,
                pending,
                &[a.w.data],
                false,
                self.decode,
            )
            .is_some()
        };
        let dot = l.dot.as_ref().filter(|_| {
            l.tuning.quantize_once
                && args.len() > 1
                && args.iter().all(|a| shared(a) && takes_dot(a))
        });
        let Some(dot) = dot else {
            return args.iter().try_for_each(|a| self.record(chain, a));
        };
        let (n_cols, n_tokens) = (first.w.n_cols, first.n_tokens);
        // the operands the quantization reads, before it runs (each product checks its own)
        crate::operand::need(OP, "x", first.x, u128::from(n_tokens) * u128::from(n_cols))?;
        if let Some((g, _)) = first.norm {
            check_words(OP, "norm", g, u64::from(n_cols), "floats")?;
        }
        let xq = dot.quantize_once(chain, first.x, first.norm, n_cols, n_tokens)?;
        args.iter()
            .try_for_each(|a| l.record_inner(chain, a, None, true, self.decode, Some(&xq)))
    }

    /// [`Linear::record_glu`] for this step's rows.
    pub fn record_glu(&self, chain: &mut Chain, a: &LinearGluArgs) -> Result<()> {
        self.lin.record_glu_with(chain, a, None, self.decode)
    }
}

/// Whether two slices are the same bytes of the same buffer.
fn slice_eq(a: &BufferSlice, b: &BufferSlice) -> bool {
    a.buffer.raw() == b.buffer.raw() && (a.offset, a.size) == (b.offset, b.size)
}

/// Refuses the block layout for weights it cannot read ([`MatvecPlan::blocks_fit`]).
fn check_blocks(
    plan: MatvecPlan,
    w: &QWeightRef,
    n_tokens: u32,
    data: &[&BufferSlice],
) -> Result<()> {
    if plan.blocks && !MatvecPlan::blocks_fit(w.ty, w.n_cols, n_tokens, data) {
        return Err(KernelError::Shape {
            op: OP,
            detail: format!(
                "the block matvec layout reads one token of Q4_K rows of 512-multiple columns at \
                 16-byte aligned offsets, not {n_tokens} tokens of {} x {} {}",
                w.n_rows, w.n_cols, w.ty
            ),
        });
    }
    Ok(())
}

/// Whether the CPU-driver variants can run here: subgroups are, or can be made, 8 wide.
fn cpu_layout_runs(ctx: &Context) -> bool {
    let sg = &ctx.caps().subgroup;
    sg.size == CPU_SUBGROUP
        || (sg.size_control && (sg.min_size..=sg.max_size).contains(&CPU_SUBGROUP))
}
