//! Recording a mixture-of-experts feed-forward (the GPU twin of `forward.rs`'s `moe_block`),
//! a child of `graph.rs` so that it records through the graph's own helpers:
//! ```text
//! h = rms_norm(x, ffn_norm)
//! logits = router · h (+ bias)                  linear
//! ids, weights = top n_used of logits, gating   moe_route
//! (batches) pairs grouped by expert             moe_group
//! a[p] = act(gate_e h + b, up_e h + b)          moe experts, GLU (per piece of whole experts)
//! y[p] = down_e a[p] + b                        moe experts
//! x += Σ_j weights[t, j] · y[t, j]              moe_combine
//! ```
//! Steps of at most [`MATVEC_MAX_TOKENS`] tokens take the expert matvec (reads only the routed
//! experts' rows); larger ones group the pairs and take the grouped matmul — or, up to
//! `Tuning::moe_dot_groups` tokens (few pairs per expert), the grouped 8-bit dot products, for
//! which steps of 2 or more tokens group their pairs too. Every step fuses the first three
//! lines into one dispatch (`moe_router`, where the router is bound whole and no post-norm is
//! pending: a workgroup per pair of router rows and token, where the f32 matmul's tiles left a
//! 32-expert router to one or a few workgroups), and the few-token steps the last two (the
//! down products' COMBINE variant, where the down tensor is bound whole): three barrier phases
//! instead of six, which is most of what a decode step's small products cost.

use octoflow_kernels::linear::MATVEC_MAX_TOKENS;
use octoflow_kernels::moe::{RouterArgs, COMBINE_MAX_USED, ROUTER_MAX_TOKENS};
use octoflow_kernels::{Combine, ExpertWeights, ExpertsArgs, Groups, LinearArgs, QWeightRef};
use octoflow_vk::{BufferSlice, Chain};

use super::{f32s, Graph, Stream};
use crate::error::{ModelError, Result};
use crate::gpu::kernels::{moe_act, moe_gating};
use crate::gpu::weights::{ExpertPiece, GpuExperts, GpuFfn, GpuMoe};
use crate::plan::MoePlan;

/// A piece of a stacked tensor as the expert kernels take it.
fn piece<'a>(m: &GpuExperts, p: &'a ExpertPiece) -> ExpertWeights<'a> {
    ExpertWeights {
        ty: m.ty,
        data: &p.slice,
        e_begin: p.e_begin,
        n_experts: p.n_experts,
        n_rows: m.n_rows,
        n_cols: m.n_cols,
    }
}

impl Graph<'_> {
    /// `x += moe(rms_norm(x))` for layer `il` (see the module doc).
    pub(super) fn moe_block(
        &self,
        chain: &mut Chain,
        il: usize,
        plan: &MoePlan,
        n: u32,
        st: &mut Stream,
    ) -> Result<()> {
        let (c, s, k) = (self.c, self.s, self.k);
        let lw = &self.w.blk[il];
        let GpuFfn::Moe(mw) = &lw.ffn else {
            return Err(ModelError::PlanWithoutTensor {
                name: format!("blk.{il}.ffn_gate_inp.weight"),
            });
        };
        let ms = s.moe.as_ref().ok_or_else(|| {
            ModelError::Gpu("the session was made without mixture-of-experts buffers".into())
        })?;
        let (n_expert, n_used) = (plan.n_expert as u32, plan.n_used as u32);
        let pairs = n * n_used;
        let rows = n as usize;
        let u32s = |b: &octoflow_vk::Buffer, len: u32| f32s(b, len as usize);
        let logits = f32s(&ms.logits, rows * plan.n_expert)?;
        let (ids, weights) = (u32s(&ms.ids, pairs)?, u32s(&ms.weights, pairs)?);
        let act = f32s(&ms.act, pairs as usize * plan.n_ff)?;
        let y = f32s(&ms.y, pairs as usize * c.n_embd)?;

        let gating = moe_gating(plan.gating);
        let unfused = k.linear.tuning().unfused_moe;
        let fused_router = !unfused
            && n <= ROUTER_MAX_TOKENS
            && st.pending.is_none()
            && mw.router.pieces.len() == 1;
        let grouped = n > MATVEC_MAX_TOKENS || self.groups_on_dots(mw, n);
        // the router writes the experts' input quantized too, where their GLU copies it
        let xq = if fused_router
            && !grouped
            && k.moe.experts.takes_quantized(mw.gate.ty, mw.gate.n_cols)
        {
            Some(f32s(
                &ms.xq,
                octoflow_kernels::q8_words(n, c.n_embd as u32) as usize,
            )?)
        } else {
            None
        };
        let input = if fused_router {
            // the norm, the router and the routing in one dispatch
            let h = f32s(&s.h, rows * c.n_embd)?;
            k.moe.router.record(
                chain,
                &RouterArgs {
                    x: &st.base,
                    norm: &lw.ffn_norm,
                    eps: c.rms_eps,
                    ty: mw.router.ty,
                    w: &mw.router.pieces[0].slice,
                    bias: mw.router_bias.as_ref(),
                    n_expert,
                    n_cols: mw.router.n_cols,
                    n_tokens: n,
                    n_used,
                    gating,
                    scale: plan.weights_scale,
                    h: &h,
                    logits: &logits,
                    ids: &ids,
                    weights: &weights,
                    xq: xq.as_ref(),
                },
            )?;
            chain.compute_barrier()?;
            h
        } else {
            self.router_and_route(chain, il, mw, plan, n, st, &logits, &ids, &weights)?
        };
        let (offsets, list) = (u32s(&ms.offsets, n_expert + 1)?, u32s(&ms.list, pairs)?);
        let groups = if grouped {
            k.moe
                .group
                .record(chain, &ids, &offsets, &list, pairs, n_expert)?;
            chain.compute_barrier()?;
            Some(Groups {
                offsets: &offsets,
                list: &list,
                max_group: n,
            })
        } else {
            None
        };

        let (g, u) = (&mw.gate, &mw.up);
        if g.ty != u.ty || g.pieces.len() != u.pieces.len() {
            return Err(ModelError::Unsupported(format!(
                "{} is {} and {} {}: the GPU path runs experts whose gate and up matrices share one type",
                g.name, g.ty, u.name, u.ty
            )));
        }
        let a = moe_act(plan.act);
        for (gp, up) in g.pieces.iter().zip(&u.pieces) {
            k.moe.experts.record(
                chain,
                &ExpertsArgs {
                    xq: xq.as_ref(),
                    w: piece(g, gp),
                    glu: Some((piece(u, up), a)),
                    bias: mw.gate_bias.as_ref(),
                    bias_up: mw.up_bias.as_ref(),
                    n_expert,
                    x: &input,
                    x_div: n_used,
                    y: &act,
                    ids: &ids,
                    n_pairs: pairs,
                    groups,
                    combine: None,
                },
            )?;
        }
        chain.compute_barrier()?;
        let d = &mw.down;
        // a few tokens whose down tensor is bound whole: the products go into the stream in
        // the same dispatch (one barrier phase fewer a layer)
        let fused =
            !unfused && groups.is_none() && d.pieces.len() == 1 && n_used <= COMBINE_MAX_USED;
        let x = st.base.clone();
        for dp in &d.pieces {
            k.moe.experts.record(
                chain,
                &ExpertsArgs {
                    xq: None,
                    w: piece(d, dp),
                    glu: None,
                    bias: mw.down_bias.as_ref(),
                    bias_up: None,
                    n_expert,
                    x: &act,
                    x_div: 1,
                    y: &y,
                    ids: &ids,
                    n_pairs: pairs,
                    groups,
                    combine: fused.then_some(Combine {
                        weights: &weights,
                        x: &x,
                        n_used,
                    }),
                },
            )?;
        }
        chain.compute_barrier()?;
        if fused {
            return Ok(());
        }
        self.combine(chain, &y, &weights, n, n_used, st)
    }

    /// Whether a step of `n` tokens (2 ..= [`MATVEC_MAX_TOKENS`]) groups its pairs by expert
    /// for the grouped 8-bit dot products (`Tuning::moe_dot_groups`): each routed expert read
    /// once for its pairs instead of once per pair, for a grouping dispatch and the combine's
    /// own phase. Only where every expert product of the block takes that kernel.
    fn groups_on_dots(&self, mw: &GpuMoe, n: u32) -> bool {
        let ex = &self.k.moe.experts;
        n >= 2
            && ex.groups_use_dot(mw.gate.ty, mw.gate.n_cols, n, true)
            && ex.groups_use_dot(mw.down.ty, mw.down.n_cols, n, false)
    }

    /// The unfused front of [`Graph::moe_block`]: the norm (a pending post-norm settled
    /// first), the router in f32, then the routing; returns the normed input.
    #[allow(clippy::too_many_arguments)]
    fn router_and_route(
        &self,
        chain: &mut Chain,
        il: usize,
        mw: &GpuMoe,
        plan: &MoePlan,
        n: u32,
        st: &mut Stream,
        logits: &BufferSlice,
        ids: &BufferSlice,
        weights: &BufferSlice,
    ) -> Result<BufferSlice> {
        let k = self.k;
        let lw = &self.w.blk[il];
        let (n_expert, n_used) = (plan.n_expert as u32, plan.n_used as u32);
        let (input, _, _) = self.block_input(chain, n, st, &lw.ffn_norm, false)?;
        if mw.router_bias.is_some() && mw.router.pieces.len() > 1 {
            return Err(ModelError::Gpu(format!(
                "{}: a bias on a router split into pieces is not supported",
                mw.router.name
            )));
        }
        // the router in f32 whatever the batch: its top-k must not flip where f16-rounded
        // operands (the cooperative-matrix kernel) would move two close logits
        for p in &mw.router.pieces {
            k.linear.record_f32(
                chain,
                &LinearArgs {
                    w: QWeightRef {
                        ty: mw.router.ty,
                        data: &p.slice,
                        n_rows: p.n_rows,
                        n_cols: mw.router.n_cols,
                    },
                    x: &input,
                    y: logits,
                    n_tokens: n,
                    y_stride: mw.router.n_rows,
                    y_col: p.row_begin,
                    bias: mw
                        .router_bias
                        .as_ref()
                        .filter(|_| mw.router.pieces.len() == 1),
                    accumulate: false,
                    norm: None,
                    pending: None,
                },
            )?;
        }
        chain.compute_barrier()?;
        k.moe.route.record(
            chain,
            logits,
            ids,
            weights,
            n,
            n_expert,
            n_used,
            moe_gating(plan.gating),
            plan.weights_scale,
        )?;
        chain.compute_barrier()?;
        Ok(input)
    }

    /// `x += Σ_j weights[t, j] · y[t, j]` on the stream.
    fn combine(
        &self,
        chain: &mut Chain,
        y: &BufferSlice,
        weights: &BufferSlice,
        n: u32,
        n_used: u32,
        st: &mut Stream,
    ) -> Result<()> {
        let c = self.c;
        let x = st.base.clone();
        self.k
            .moe
            .combine
            .record(chain, y, weights, &x, n, n_used, c.n_embd as u32)?;
        chain.compute_barrier()?;
        Ok(())
    }
}
