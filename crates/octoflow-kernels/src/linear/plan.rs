//! The work layout of the GPU matvec (`matvec.comp`'s specialization constants) per shape, and
//! its pipelines per layout.

use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Pipeline};

use super::{CPU_MATVEC_TN, CPU_ROWS, MATVEC_MAX_TOKENS, MATVEC_TPR, OP};
use crate::error::{KernelError, Result};
use crate::spec::SpecPipelines;

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
    /// The block layout (`SB` in `matvec.comp`): 64 elements of a Q4_K row per invocation at a
    /// time from three 16-byte loads; one token only, weights that [`MatvecPlan::blocks_fit`].
    pub blocks: bool,
}

impl MatvecPlan {
    /// The layout before per-shape plans (and the only one of the CPU layout, which ignores it).
    #[cfg(test)]
    pub(crate) const DEFAULT: MatvecPlan = MatvecPlan {
        wg: 128,
        tpr: MATVEC_TPR,
        maxt: MATVEC_MAX_TOKENS,
        rpt: 1,
        blocks: false,
    };

    /// The layout for `n_tokens` (1 ..= [`MATVEC_MAX_TOKENS`]) tokens of an `n_rows` x `n_cols`
    /// matrix, the fastest of every layout at the models' decode shapes (`matvec_layouts` in
    /// benches/linear_bench.rs): long rows (64+ chunks, the FFN down projections) gain from 128
    /// invocations per row for one token and 64 for a few; pipelines for exactly the tokens they
    /// take hold fewer registers; single-token pipelines read each chunk of x once for all of an
    /// invocation's rows, so vocabulary-sized matrices take four rows per invocation and long
    /// rows two; the type does not change the choice.
    ///
    /// One token of a large square-ish matrix (4,096+ rows below vocabulary size, 4,096 to
    /// 8,192 columns: an 8B model's projections and gate/up) takes the staged layout for four
    /// tokens, eight row groups of 32 lanes with two rows each: x staged in shared memory once
    /// per workgroup beats every single-token layout there, and most where the norm is fused
    /// (the layout sweep in docs/perf-log). Pipelines with a pending post-norm take one token only:
    /// they use [`MatvecPlan::choose_direct`].
    pub(crate) fn choose(n_rows: u32, n_cols: u32, n_tokens: u32) -> MatvecPlan {
        if n_tokens <= 1 && (4096..32768).contains(&n_rows) && (4096..=8192).contains(&n_cols) {
            return MatvecPlan {
                wg: 8 * MATVEC_TPR,
                tpr: MATVEC_TPR,
                maxt: 4,
                rpt: 2,
                blocks: false,
            };
        }
        Self::choose_direct(n_rows, n_cols, n_tokens)
    }

    /// [`MatvecPlan::choose`] without the staged layout for one token: a pipeline for exactly
    /// the tokens it takes where it takes one.
    pub(crate) fn choose_direct(n_rows: u32, n_cols: u32, n_tokens: u32) -> MatvecPlan {
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
                blocks: false,
            };
        }
        let (wg, tpr) = match (long, maxt) {
            (true, 1) => (128, 128),
            (true, _) => (64, 64),
            (false, _) => (64, MATVEC_TPR),
        };
        // one token: x is read once per chunk for all of an invocation's rows, which pays on
        // vocabulary-sized matrices and a little on long rows
        let rpt = match (maxt, vocab, long) {
            (1, true, _) => 4,
            (1, false, true) => 2,
            _ => 1,
        };
        MatvecPlan {
            wg,
            tpr,
            maxt,
            rpt,
            blocks: false,
        }
    }

    /// The block layout for one token of an `n_rows` x `n_cols` matrix whose weights
    /// [`MatvecPlan::blocks_fit`], where it beats the other layouts (`norm`: the RMS norm is
    /// fused): rows of up to 8,192 columns, except 4,096+ rows under a fused norm, where the
    /// staged layout of [`MatvecPlan::choose`] stays ahead. Longer rows and the gate/up pair
    /// keep their layouts until a sweep says otherwise (the sweep in docs/perf-log).
    pub(crate) fn blocks(n_rows: u32, n_cols: u32, norm: bool) -> Option<MatvecPlan> {
        (n_cols <= 8192 && !(norm && n_rows >= 4096)).then_some(MatvecPlan {
            wg: 4 * MATVEC_TPR,
            tpr: 2 * MATVEC_TPR,
            maxt: 1,
            rpt: 4,
            blocks: true,
        })
    }

    /// Whether the block layout reads `n_tokens` tokens of these weights (every matrix of the
    /// dispatch): Q4_K, one token, rows of an even number of super-blocks (16-byte multiples)
    /// from 16-byte aligned offsets.
    pub(crate) fn blocks_fit(ty: GgmlType, n_cols: u32, n_tokens: u32, w: &[&BufferSlice]) -> bool {
        ty == GgmlType::Q4_K
            && n_tokens == 1
            && n_cols.is_multiple_of(512)
            && w.iter().all(|s| s.offset.is_multiple_of(16))
    }

    /// [`MatvecPlan::choose`] for the gate/up/activation dispatch: two rows per invocation for
    /// one token over 4096+ rows, so that each chunk of x (and of the norm's g, with the sum of
    /// squares when the norm is fused) is read once for two rows of both matrices (shorter
    /// matrices lose at two).
    pub(crate) fn choose_glu(n_rows: u32, n_cols: u32, n_tokens: u32) -> MatvecPlan {
        Self::glu_rows(Self::choose(n_rows, n_cols, n_tokens), n_rows)
    }

    /// [`MatvecPlan::choose_glu`] without the staged layout for one token (a pending
    /// post-norm's pipelines).
    pub(crate) fn choose_glu_direct(n_rows: u32, n_cols: u32, n_tokens: u32) -> MatvecPlan {
        Self::glu_rows(Self::choose_direct(n_rows, n_cols, n_tokens), n_rows)
    }

    fn glu_rows(plan: MatvecPlan, n_rows: u32) -> MatvecPlan {
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
    pub(crate) fn rows(&self) -> u32 {
        self.wg / self.tpr * self.rpt
    }

    /// Shared-memory bytes of the layout (`partial` in `matvec.comp`, the GLU variant's size),
    /// with the pending post-norm's sums where `pend`.
    /// Pipelines for two or four tokens stage x (32 chunks of 32 floats per token) in memory
    /// the partial sums share.
    pub(crate) fn shared_bytes(&self, pend: bool) -> u32 {
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
pub(super) enum Matvec {
    Spec(SpecPipelines),
    Fixed(Pipeline),
}

impl Matvec {
    /// The pipeline and workgroup grid of `n_rows` rows in the layout `plan` (GPU layout; the
    /// CPU layout has one layout and ignores the plan), the pipeline with the pending post-norm
    /// path where `pend` (`PEND` in `matvec.comp`).
    /// Errors on a plan that does not fit `n_tokens` or the device.
    pub(super) fn layout(
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
                    || (p.blocks && (p.maxt != 1 || pend))
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
                    u32::from(plan.blocks),
                    0,
                ];
                let pl = s.get(ctx, spec)?;
                let groups = ctx.groups_1d(u64::from(n_rows), plan.rows())?;
                Ok((pl, groups))
            }
        }
    }
}
/// The workgroup grid of the CPU-driver kernels for `n_rows` x `n_tokens` (`tn` tokens per
/// workgroup), or a shape error past the device's limits.
pub(super) fn cpu_groups(chain: &Chain, n_rows: u32, n_tokens: u32, tn: u32) -> Result<[u32; 3]> {
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
