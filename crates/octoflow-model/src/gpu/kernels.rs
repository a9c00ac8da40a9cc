//! Every kernel the model's chains use, built once per loaded model.

use octoflow_kernels::add::Add;
use octoflow_kernels::advance::Advance;
use octoflow_kernels::gate::Gate;
use octoflow_kernels::{
    Argmax, Attention, GetRows, Glu, GluOp, Linear, Lora, Moe, MoeAct, MoeGating, PickIds, RmsNorm,
    Rope, RopeMode, RopeStore, Sample, SetRows,
};
use octoflow_vk::Context;

use crate::config::{Activation, RopeType};
use crate::error::Result;
use crate::plan::{Gating, MoeAct as PlanAct};

/// The GLU kernel's operation for a plan's activation.
pub fn glu_op(act: Activation) -> GluOp {
    match act {
        Activation::Silu => GluOp::Silu,
        Activation::GeluTanh => GluOp::GeluTanh,
    }
}

/// The routing kernel's gating for a plan's.
pub fn moe_gating(g: Gating) -> MoeGating {
    match g {
        Gating::SoftmaxOfSelected => MoeGating::SoftmaxOfSelected,
        Gating::Softmax { norm } => MoeGating::Softmax { norm },
    }
}

/// The expert kernels' activation for a plan's.
pub fn moe_act(a: PlanAct) -> MoeAct {
    match a {
        PlanAct::Silu => MoeAct::Silu,
        PlanAct::SwigluOai { alpha, limit } => MoeAct::SwigluOai { alpha, limit },
    }
}

/// The RoPE kernels' pairing for a plan's RoPE kind.
pub fn rope_mode(kind: RopeType) -> RopeMode {
    match kind {
        RopeType::Normal => RopeMode::Normal,
        RopeType::Neox => RopeMode::Neox,
    }
}

/// The pipelines of one device.
pub struct Kernels {
    pub linear: Linear,
    pub get_rows: GetRows,
    pub rms_norm: RmsNorm,
    pub rope: Rope,
    pub rope_store: RopeStore,
    pub set_rows: SetRows,
    pub attention: Attention,
    pub glu: Glu,
    pub add: Add,
    pub argmax: Argmax,
    pub sample: Sample,
    pub gate: Gate,
    pub advance: Advance,
    pub pick_ids: PickIds,
    pub lora: Lora,
    pub moe: Moe,
}

impl Kernels {
    /// Builds every pipeline for `ctx`'s device.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Self {
            linear: Linear::new(ctx)?,
            get_rows: GetRows::new(ctx)?,
            rms_norm: RmsNorm::new(ctx)?,
            rope: Rope::new(ctx)?,
            rope_store: RopeStore::new(ctx)?,
            set_rows: SetRows::new(ctx)?,
            attention: Attention::new(ctx)?,
            glu: Glu::new(ctx)?,
            add: Add::new(ctx)?,
            argmax: Argmax::new(ctx)?,
            sample: Sample::new(ctx)?,
            gate: Gate::new(ctx)?,
            advance: Advance::new(ctx)?,
            pick_ids: PickIds::new(ctx)?,
            lora: Lora::new(ctx)?,
            moe: Moe::new(ctx)?,
        })
    }
}
