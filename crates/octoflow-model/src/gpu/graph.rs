//! Recording the forward pass of `n` tokens into a chain: the GPU twin of `forward.rs`, step for
//! step (see the diagram there). Activations are f32 row-major `[n, width]` in the session's
//! scratch buffers; the KV cache is f32 `[n_ctx, n_head_kv * head_dim]` per layer. Positions are
//! read on the GPU ([`PosSource`]): for one sequence, the batch's first position from the control
//! block (`ctl::POS`); for a batch of many sequences, a per-token (position, block table offset)
//! table. Either way the same recording serves every position. Decode steps of one sequence
//! (runs of at most 8 tokens) fold the per-head norms, RoPE and the KV-cache write into the
//! attention dispatch ([`octoflow_kernels::Attention::record_fresh`]). Barriers between the kernels are
//! compute-to-compute ([`Chain::compute_barrier`]); whoever follows a recording with a transfer
//! or an indirect dispatch adds a full barrier.

use octoflow_gguf::GgmlType;
use octoflow_kernels::advance::ctl;
use octoflow_kernels::{
    fresh_applies, AttentionArgs, FreshKv, GetRowsArgs, GluOp, LinearArgs, LinearGluArgs,
    PendingNorm, Positions, QWeightRef, RopeStoreArgs,
};
use octoflow_vk::{Buffer, BufferSlice, Chain};

use crate::adapter::Target;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::forward::Logits;
use crate::gpu::adapters::{GpuAdapters, MixSource};
use crate::gpu::kernels::{glu_op, rope_mode, Kernels};
use crate::gpu::scratch::Scratch;
use crate::gpu::weights::{GpuMatrix, GpuWeights};
use crate::plan::{planned, planned_bias, qk_norms, AttnPlan, FfnPlan, GluPlan};

#[path = "moe_block.rs"]
mod moe_block;

/// Where the batch's token ids are read from.
#[derive(Clone)]
pub enum TokenSource {
    /// The scratch id list (`n` ids written by the CPU).
    Ids,
    /// `ctl::TOKEN` of the control block (one token, written by the previous step's sampler).
    Control,
    /// `n` u32 ids in this slice (written on the device).
    Slice(BufferSlice),
}

/// Where the tokens' positions are read from (see [`Positions`]).
#[derive(Clone)]
pub struct PosSource {
    /// The u32 words.
    pub buf: BufferSlice,
    /// Index of the first word read.
    pub offset: u32,
    /// One run from `buf[offset]`, or a per-token (position, block table offset) table.
    pub mode: Positions,
    /// Positions one sequence holds (the attention bound).
    pub seq_rows: u32,
}

/// LoRA adapters applied on the fly, and where each token's mix id is read.
#[derive(Clone)]
pub struct GraphLora<'a> {
    pub ad: &'a GpuAdapters,
    pub mix: MixSource,
}

/// What a recording needs: the kernels, the model, its weights, the buffers, the positions and
/// the adapters (if any).
pub struct Graph<'a> {
    pub k: &'a Kernels,
    pub c: &'a ModelConfig,
    pub w: &'a GpuWeights,
    pub s: &'a Scratch,
    pub pos: PosSource,
    pub lora: Option<GraphLora<'a>>,
    /// Every row of the step samples a token (several sequences' decode rows): the products
    /// take the kernels [`octoflow_kernels::Linear::step`] gives such steps.
    pub decode: bool,
}

/// The residual stream between blocks: the buffer holding it (`s.x`, or `s.h` while a
/// single-token step of a post-norm model ping-pongs), and a block output whose post-norm and
/// add are left to the next block's input (`rms_norm(p) * weight`, see [`PendingNorm`]).
struct Stream {
    base: BufferSlice,
    pending: Option<(BufferSlice, BufferSlice)>,
}

/// The data of a matrix held in one piece (rows from 0).
fn single(m: &GpuMatrix) -> Option<&BufferSlice> {
    match m.pieces.as_slice() {
        [p] if p.row_begin == 0 && p.n_rows == m.n_rows => Some(&p.slice),
        _ => None,
    }
}

/// The first `n_floats` f32 of `b`.
fn f32s(b: &Buffer, n_floats: usize) -> Result<BufferSlice> {
    Ok(b.slice(0, 4 * n_floats as u64)?)
}

/// Appends the products of matrix `m`'s row pieces (`y[.., row_begin ..]` each; the pending
/// post-norm's settled stream written by the first) to `args`.
#[allow(clippy::too_many_arguments)]
fn piece_args<'a>(
    args: &mut Vec<LinearArgs<'a>>,
    m: &'a GpuMatrix,
    x: &'a BufferSlice,
    y: &'a BufferSlice,
    n: u32,
    bias: Option<&'a BufferSlice>,
    accumulate: bool,
    norm: Option<(&'a BufferSlice, f32)>,
    pending: Option<PendingNorm<'a>>,
) -> Result<()> {
    if bias.is_some() && m.pieces.len() > 1 {
        return Err(ModelError::Gpu(format!(
            "{}: a bias on a matrix split into {} pieces is not supported",
            m.name,
            m.pieces.len()
        )));
    }
    for (i, p) in m.pieces.iter().enumerate() {
        let pending = pending.map(|pn| PendingNorm {
            settle: pn.settle.filter(|_| i == 0),
            ..pn
        });
        args.push(LinearArgs {
            w: QWeightRef {
                ty: m.ty,
                data: &p.slice,
                n_rows: p.n_rows,
                n_cols: m.n_cols,
            },
            x,
            y,
            n_tokens: n,
            y_stride: m.n_rows,
            y_col: p.row_begin,
            bias,
            accumulate,
            norm,
            pending,
        });
    }
    Ok(())
}

impl Graph<'_> {
    /// Records embeddings, every layer and (per `logits`) the final norm and the vocabulary
    /// projection of `n` tokens, into `scratch.logits`.
    pub fn forward(
        &self,
        chain: &mut Chain,
        n: u32,
        src: &TokenSource,
        logits: Logits,
    ) -> Result<()> {
        self.layers(chain, n, src)?;
        self.output(chain, n, logits)
    }

    /// Records embeddings and every layer of `n` tokens (the residual stream ends in `s.x`).
    pub fn layers(&self, chain: &mut Chain, n: u32, src: &TokenSource) -> Result<()> {
        self.embed(chain, n, src)?;
        let x = f32s(&self.s.x, n as usize * self.c.n_embd)?;
        let mut st = Stream {
            base: x.clone(),
            pending: None,
        };
        for (il, plan) in self.c.blocks.iter().enumerate() {
            // the FFN's buffers are idle during the attention block: the kernels' temporaries
            // (split-K partial sums, attention pieces) go there instead of memory of their own
            chain.lend_scratch(Some(self.s.ffn_gate.whole()));
            self.attention_block(chain, il, &plan.attn, n, &mut st)?;
            chain.lend_scratch(None);
            match &plan.ffn {
                FfnPlan::Glu(g) => self.glu_block(chain, il, g, n, &mut st)?,
                FfnPlan::Moe(m) => self.moe_block(chain, il, m, n, &mut st)?,
            }
        }
        self.settle(chain, n, &mut st, &x)
    }

    /// Whether the post-norms of this step are left to the next block's input: single tokens
    /// on the GPU matvec (whose fused norm takes them), no adapters, and a post-norm after
    /// every block (gemma3). Two barrier stages fewer per layer.
    fn defers_post_norms(&self, n: u32) -> bool {
        n == 1
            && self.lora.is_none()
            && self.lin().fuses_norm(n)
            && self.c.n_embd.is_multiple_of(32)
            && self
                .c
                .blocks
                .iter()
                .all(|b| b.attn.post_norm && b.glu().is_ok_and(|g| g.post_norm))
            && !self.k.linear.tuning().unfused_post
    }

    /// Records the pending post-norm and its add (if any) so that the stream is whole in `out`
    /// (its own buffer or another).
    fn settle(&self, chain: &mut Chain, n: u32, st: &mut Stream, out: &BufferSlice) -> Result<()> {
        let c = self.c;
        if let Some((p, w)) = st.pending.take() {
            self.k.rms_norm.record_add_to(
                chain,
                &p,
                &w,
                &st.base,
                out,
                n,
                c.n_embd as u32,
                c.rms_eps,
            )?;
            chain.compute_barrier()?;
            st.base = out.clone();
        }
        Ok(())
    }

    /// The other buffer of the single-token ping-pong (`s.x` ↔ `s.h`): where a block that
    /// consumes a pending post-norm writes the settled stream.
    fn other(&self, base: &BufferSlice) -> Result<BufferSlice> {
        let width = base.size / 4;
        let x = f32s(&self.s.x, width as usize)?;
        if base.buffer.raw() == x.buffer.raw() {
            f32s(&self.s.h, width as usize)
        } else {
            Ok(x)
        }
    }

    /// The input norm of a block over the stream `st`: the pending post-norm (if any) handed
    /// to the block's fused-norm products with the buffer they settle the stream into, or
    /// recorded first where the norm is not fused; then [`Graph::normed`].
    #[allow(clippy::type_complexity)]
    fn block_input(
        &self,
        chain: &mut Chain,
        n: u32,
        st: &mut Stream,
        weight: &BufferSlice,
        small: bool,
    ) -> Result<(
        BufferSlice,
        Option<BufferSlice>,
        Option<(BufferSlice, BufferSlice, BufferSlice)>,
    )> {
        let width = n as usize * self.c.n_embd;
        let h = f32s(&self.s.h, width)?;
        if st.pending.is_some() && !self.norm_fuses(n, small) {
            // into s.x: the norm is about to be written to s.h
            self.settle(chain, n, st, &f32s(&self.s.x, width)?)?;
        }
        let (input, fused) = self.normed(chain, n, &st.base, &h, weight, small)?;
        let pending = match st.pending.take() {
            Some((p, w)) => {
                let to = self.other(&st.base)?;
                st.base = to.clone();
                Some((p, w, to))
            }
            None => None,
        };
        Ok((input, fused, pending))
    }

    /// `x = token_embd[ids] * embedding_scale`.
    fn embed(&self, chain: &mut Chain, n: u32, src: &TokenSource) -> Result<()> {
        let (c, w, s) = (self.c, self.w, self.s);
        let x = f32s(&s.x, n as usize * c.n_embd)?;
        let (ids, ids_offset) = match src {
            TokenSource::Ids => (s.ids.whole(), 0),
            TokenSource::Control => (s.ctl.whole(), ctl::TOKEN),
            TokenSource::Slice(b) => (b.clone(), 0),
        };
        for p in &w.token_embd.pieces {
            self.k.get_rows.record(
                chain,
                &GetRowsArgs {
                    ty: w.token_embd.ty,
                    table: &p.slice,
                    n_cols: w.token_embd.n_cols,
                    row_begin: p.row_begin,
                    row_end: p.row_begin + p.n_rows,
                    ids: &ids,
                    ids_offset,
                    n_ids: n,
                    out: &x,
                    scale: c.embedding_scale,
                },
            )?;
        }
        chain.compute_barrier()?;
        Ok(())
    }

    /// `x += attention(rmsnorm(x))` for layer `il`, writing this batch's keys and values into the
    /// layer's cache at the batch's positions.
    fn attention_block(
        &self,
        chain: &mut Chain,
        il: usize,
        plan: &AttnPlan,
        n: u32,
        st: &mut Stream,
    ) -> Result<()> {
        let (c, s, k) = (self.c, self.s, self.k);
        let lw = &self.w.blk[il];
        let rows = n as usize;
        let q = f32s(&s.q, rows * c.q_dim())?;
        let kk = f32s(&s.k, rows * c.k_dim())?;
        let v = f32s(&s.v, rows * c.v_dim())?;
        let att = f32s(&s.att, rows * c.n_head * c.head_dim_v)?;
        let eps = c.rms_eps;

        let (input, fused, pend) = self.block_input(chain, n, st, &lw.attn_norm, true)?;
        let norm = fused.as_ref().map(|g| (g, eps));
        let (bq, bk, bv) = (
            lw.attn_q_bias.as_ref(),
            lw.attn_k_bias.as_ref(),
            lw.attn_v_bias.as_ref(),
        );
        // with a pending post-norm, the q product also writes the settled stream
        let pending = |settle: bool| {
            pend.as_ref().map(|(p, w, to)| PendingNorm {
                p,
                weight: w,
                settle: settle.then_some(to),
            })
        };
        let (pq, pkv) = (pending(true), pending(false));
        let qkv = [
            (&lw.attn_q, &q, bq, pq),
            (&lw.attn_k, &kk, bk, pkv),
            (&lw.attn_v, &v, bv, pkv),
        ];
        self.linear_many(chain, &qkv, &input, n, norm)?;
        self.adapt(
            chain,
            il,
            n,
            &[
                (Target::Q, &input, &q),
                (Target::K, &input, &kk),
                (Target::V, &input, &v),
            ],
        )?;
        chain.compute_barrier()?;

        let ps = &self.pos;
        let mode = rope_mode(plan.rope.kind);
        let qk_norm = qk_norms(il, plan, &lw.attn_q_norm, &lw.attn_k_norm)?;
        let (kc, vc) = &s.kv[il];
        let (kc, vc) = (kc.whole(), vc.whole());
        let args = AttentionArgs {
            q: &q,
            k: &kc,
            v: &vc,
            out: &att,
            n_tokens: n,
            n_head: c.n_head as u32,
            n_head_kv: c.n_head_kv as u32,
            head_dim: c.head_dim as u32,
            head_dim_v: c.head_dim_v as u32,
            n_kv_rows: ps.seq_rows,
            window: plan.kind.window().map_or(0, |w| w as u32),
            scale: plan.scale,
            pos: &ps.buf,
            pos_offset: ps.offset,
            positions: ps.mode,
            kv: s.kv_type,
            sinks: planned(il, plan.sinks, &lw.attn_sinks, "attn_sinks")?,
        };
        if fresh_applies(&args) && !self.k.linear.tuning().unfused_rope {
            // decode steps: the head norms, RoPE and the cache write happen inside the
            // attention dispatch (one or two barrier stages fewer per layer)
            let fresh = FreshKv {
                k: &kk,
                v: &v,
                n_ctx: s.n_ctx,
                mode,
                freqs: lw.rope_for(s.n_ctx as usize),
                qk_norm: qk_norm.map(|(qn, kn)| (qn, kn, eps)),
            };
            k.attention.record_fresh(chain, &args, &fresh)?;
        } else {
            if let Some((qn, kn)) = qk_norm {
                let hd = c.head_dim as u32;
                k.rms_norm
                    .record(chain, &q, qn, &q, n * c.n_head as u32, hd, eps)?;
                k.rms_norm
                    .record(chain, &kk, kn, &kk, n * c.n_head_kv as u32, hd, eps)?;
                chain.compute_barrier()?;
            }
            // rotary embedding at the batch's positions (q in place, k straight into the
            // cache, the k scratch left unrotated) and the values into the cache: one dispatch
            k.rope_store.record(
                chain,
                &RopeStoreArgs {
                    q: &q,
                    k: &kk,
                    v: &v,
                    k_cache: &kc,
                    v_cache: &vc,
                    kv: s.kv_type,
                    n_ctx: s.n_ctx,
                    n_tokens: n,
                    n_head: c.n_head as u32,
                    n_head_kv: c.n_head_kv as u32,
                    head_dim: c.head_dim as u32,
                    head_dim_v: c.head_dim_v as u32,
                    mode,
                    freqs: lw.rope_for(s.n_ctx as usize),
                    pos: &ps.buf,
                    pos_offset: ps.offset,
                    positions: ps.mode,
                },
            )?;
            chain.compute_barrier()?;
            k.attention.record(chain, &args)?;
        }
        chain.compute_barrier()?;
        self.project_residual(
            chain,
            (il, Target::O),
            (
                &lw.attn_output,
                planned_bias(il, plan.out_bias, &lw.attn_output_bias, "attn_output")?,
            ),
            &att,
            planned(
                il,
                plan.post_norm,
                &lw.post_attention_norm,
                "post_attention_norm",
            )?,
            n,
            st,
        )
    }

    /// `x += down(act(gate(h)) * up(h))` with `h = rmsnorm(x)` for layer `il`. Without adapters
    /// on gate/up, few-token steps (the matvec kernel) and batches on cooperative matrices record
    /// the two products and the activation as one dispatch
    /// ([`octoflow_kernels::Linear::record_glu`]): one barrier stage and two dispatches fewer.
    fn glu_block(
        &self,
        chain: &mut Chain,
        il: usize,
        plan: &GluPlan,
        n: u32,
        st: &mut Stream,
    ) -> Result<()> {
        let (c, s, k) = (self.c, self.s, self.k);
        let lw = &self.w.blk[il];
        let gw = lw.glu()?;
        let rows = n as usize;
        let gate = f32s(&s.ffn_gate, rows * c.n_ff)?;
        let up = f32s(&s.ffn_up, rows * c.n_ff)?;
        let op = glu_op(plan.act);
        // the norm is fused into single-token steps whose gate, up and activation are one
        // dispatch: one barrier stage less per layer (measured: docs/perf-log/kernel-comment-notes.md)
        let one_dispatch = self.fused_glu(il, n, &st.base, &gate, op, None).is_some();
        let (input, fused, pend) = self.block_input(chain, n, st, &lw.ffn_norm, one_dispatch)?;
        let norm = fused.as_ref().map(|g| (g, c.rms_eps));
        let pending = pend.as_ref().map(|(p, w, to)| PendingNorm {
            p,
            weight: w,
            settle: Some(to),
        });
        if let Some(mut args) = self.fused_glu(il, n, &input, &gate, op, norm) {
            args.pending = pending;
            self.lin().record_glu(chain, &args)?;
        } else {
            // a pending post-norm was settled by block_input: the norm is not fused here
            self.linear(
                chain,
                &gw.ffn_gate,
                &input,
                &gate,
                n,
                None,
                false,
                norm,
                None,
            )?;
            self.linear(chain, &gw.ffn_up, &input, &up, n, None, false, norm, None)?;
            self.adapt(
                chain,
                il,
                n,
                &[(Target::Gate, &input, &gate), (Target::Up, &input, &up)],
            )?;
            chain.compute_barrier()?;
            k.glu
                .record(chain, &gate, &up, &gate, (rows * c.n_ff) as u32, op)?;
        }
        chain.compute_barrier()?;
        // up is dead once the activation has read it: the down projection's temporaries
        chain.lend_scratch(Some(s.ffn_up.whole()));
        self.project_residual(
            chain,
            (il, Target::Down),
            (&gw.ffn_down, None),
            &gate,
            planned(il, plan.post_norm, &lw.post_ffw_norm, "post_ffw_norm")?,
            n,
            st,
        )?;
        chain.lend_scratch(None);
        Ok(())
    }

    /// The arguments of layer `il`'s gate, up and activation as one fused dispatch into `out`,
    /// where that applies: the matvec path or the cooperative-matrix kernel
    /// ([`octoflow_kernels::Linear::fuses_glu`]), gate and
    /// up single-piece matrices of one type and shape, and no adapters on either (their products
    /// must be added to gate and up before the activation).
    fn fused_glu<'b>(
        &'b self,
        il: usize,
        n: u32,
        input: &'b BufferSlice,
        out: &'b BufferSlice,
        op: GluOp,
        norm: Option<(&'b BufferSlice, f32)>,
    ) -> Option<LinearGluArgs<'b>> {
        let gw = self.w.blk[il].glu().ok()?;
        let (g, u) = (&gw.ffn_gate, &gw.ffn_up);
        let adapted = self.lora.as_ref().is_some_and(|l| {
            [Target::Gate, Target::Up]
                .iter()
                .any(|&t| l.ad.stack(il, t).is_some())
        });
        let (Some(gp), Some(up)) = (single(g), single(u)) else {
            return None;
        };
        if adapted
            || (g.n_rows, g.n_cols) != (u.n_rows, u.n_cols)
            || !self.lin().fuses_glu(n, g.ty, u.ty)
            || (self.lin().uses_coop(n) && self.k.linear.tuning().unfused_glu)
        {
            return None;
        }
        let weight = |m: &GpuMatrix, data| QWeightRef {
            ty: m.ty,
            data,
            n_rows: m.n_rows,
            n_cols: m.n_cols,
        };
        Some(LinearGluArgs {
            gate: weight(g, gp),
            up: weight(u, up),
            x: input,
            y: out,
            n_tokens: n,
            op,
            norm,
            pending: None,
        })
    }

    /// `x += post_norm(m · a + bias)` (with `which`'s adapters) on the stream `st`; without a
    /// post-norm the projection adds straight into it; where the step defers post-norms
    /// ([`Graph::defers_post_norms`]) the product is left pending on the stream.
    #[allow(clippy::too_many_arguments)]
    fn project_residual(
        &self,
        chain: &mut Chain,
        which: (usize, Target),
        (m, bias): (&GpuMatrix, Option<&BufferSlice>),
        a: &BufferSlice,
        post_norm: Option<&BufferSlice>,
        n: u32,
        st: &mut Stream,
    ) -> Result<()> {
        let (c, s, k) = (self.c, self.s, self.k);
        let width = n as usize * c.n_embd;
        // the block's input took any pending post-norm; settled here all the same
        let base = st.base.clone();
        self.settle(chain, n, st, &base)?;
        let x = &st.base;
        match post_norm {
            None => {
                self.linear(chain, m, a, x, n, bias, true, None, None)?;
                self.adapt(chain, which.0, n, &[(which.1, a, x)])?;
            }
            Some(norm) => {
                let o = f32s(&s.o, width)?;
                self.linear(chain, m, a, &o, n, bias, false, None, None)?;
                self.adapt(chain, which.0, n, &[(which.1, a, &o)])?;
                chain.compute_barrier()?;
                if self.defers_post_norms(n) {
                    st.pending = Some((o, norm.clone()));
                    return Ok(());
                }
                k.rms_norm
                    .record_add(chain, &o, norm, x, n, c.n_embd as u32, c.rms_eps)?;
            }
        }
        chain.compute_barrier()?;
        Ok(())
    }

    /// Final norm and vocabulary projection of the last token (`Last`) or of all (`All`).
    fn output(&self, chain: &mut Chain, n: u32, logits: Logits) -> Result<()> {
        let (c, s, k, w) = (self.c, self.s, self.k, self.w);
        let row_bytes = 4 * c.n_embd as u64;
        let (first, rows) = match logits {
            Logits::None => return Ok(()),
            Logits::Last => (n - 1, 1),
            Logits::All => (0, n),
        };
        if rows > s.t_logits {
            return Err(ModelError::Gpu(format!(
                "{rows} rows of logits requested, the session's buffer holds {}",
                s.t_logits
            )));
        }
        let x =
            s.x.slice(u64::from(first) * row_bytes, u64::from(rows) * row_bytes)?;
        let h = f32s(&s.h, rows as usize * c.n_embd)?;
        k.rms_norm.record(
            chain,
            &x,
            &w.output_norm,
            &h,
            rows,
            c.n_embd as u32,
            c.rms_eps,
        )?;
        chain.compute_barrier()?;
        let out = f32s(&s.logits, rows as usize * c.n_vocab)?;
        self.linear(chain, &w.output, &h, &out, rows, None, false, None, None)?;
        chain.compute_barrier()?;
        Ok(())
    }

    /// Final norm and vocabulary projection of the `n_out` rows of the residual stream whose
    /// indices are in `rows` (`[n_out]` u32), into `scratch.logits` `[n_out, n_vocab]`.
    pub fn output_rows(&self, chain: &mut Chain, n_out: u32, rows: &BufferSlice) -> Result<()> {
        let (c, s, k, w) = (self.c, self.s, self.k, self.w);
        if n_out > s.t_logits {
            return Err(ModelError::Gpu(format!(
                "{n_out} rows of logits requested, the buffer holds {}",
                s.t_logits
            )));
        }
        let width = n_out as usize * c.n_embd;
        let (x, o, h) = (
            f32s(&s.x, s.t_max as usize * c.n_embd)?,
            f32s(&s.o, width)?,
            f32s(&s.h, width)?,
        );
        k.get_rows.record(
            chain,
            &GetRowsArgs {
                ty: GgmlType::F32,
                table: &x,
                n_cols: c.n_embd as u32,
                row_begin: 0,
                row_end: s.t_max,
                ids: rows,
                ids_offset: 0,
                n_ids: n_out,
                out: &o,
                scale: 1.0,
            },
        )?;
        chain.compute_barrier()?;
        k.rms_norm.record(
            chain,
            &o,
            &w.output_norm,
            &h,
            n_out,
            c.n_embd as u32,
            c.rms_eps,
        )?;
        chain.compute_barrier()?;
        let out = f32s(&s.logits, n_out as usize * c.n_vocab)?;
        self.linear(chain, &w.output, &h, &out, n_out, None, false, None, None)?;
        chain.compute_barrier()?;
        Ok(())
    }

    /// The input of a block's projections: `x` itself when the norm is fused into them
    /// (returned: its weight), else `rms_norm(x)` recorded into `h`. Fused (`small`) for
    /// single-token steps of the attention block, whose projections are small and latency-bound,
    /// and of the FFN where gate, up and the activation are one dispatch (each measured faster:
    /// docs/perf-log/kernel-comment-notes.md).
    fn normed(
        &self,
        chain: &mut Chain,
        n: u32,
        x: &BufferSlice,
        h: &BufferSlice,
        weight: &BufferSlice,
        small: bool,
    ) -> Result<(BufferSlice, Option<BufferSlice>)> {
        if self.norm_fuses(n, small) {
            return Ok((x.clone(), Some(weight.clone())));
        }
        let c = self.c;
        self.k
            .rms_norm
            .record(chain, x, weight, h, n, c.n_embd as u32, c.rms_eps)?;
        chain.compute_barrier()?;
        Ok((h.clone(), None))
    }

    /// Whether [`Graph::normed`] fuses the norm into the products of a block (`small`: ones it
    /// pays for): single tokens, and batches of a few on 8-bit dot products (whose kernel sums
    /// the squares while it quantizes x). Adapters read the normed input, so with them the norm
    /// is never fused.
    fn norm_fuses(&self, n: u32, small: bool) -> bool {
        let lin = self.lin();
        small && (n == 1 || lin.dot_batch(n)) && self.lora.is_none() && lin.fuses_norm(n)
    }

    /// The product kernels as this step's rows take them.
    fn lin(&self) -> octoflow_kernels::StepLinear<'_> {
        self.k.linear.step(self.decode)
    }

    /// Adds the adapters' products of layer `il` to projections whose base products were
    /// recorded since the last barrier: for each `(target, x, y)`, `y += Σ s · B (A x)`. Records
    /// the shrinks (reading `x`), a barrier, then the expands (adding into `y`); the caller
    /// records the barrier after. Nothing without adapters on these projections.
    fn adapt(
        &self,
        chain: &mut Chain,
        il: usize,
        n: u32,
        jobs: &[(Target, &BufferSlice, &BufferSlice)],
    ) -> Result<()> {
        let Some(l) = &self.lora else {
            return Ok(());
        };
        let active: Vec<_> = jobs
            .iter()
            .filter_map(|&(t, x, y)| l.ad.stack(il, t).map(|st| (st, x, y)))
            .collect();
        if active.is_empty() {
            return Ok(());
        }
        let tb = self.s.lora_t.as_ref().ok_or_else(|| {
            ModelError::Gpu("the session was made without room for adapters".into())
        })?;
        let part = self.s.lora_part;
        let scales = l.ad.scales_slice();
        let mix = l.mix.kernel_mix(l.ad, &scales);
        let ts = active
            .iter()
            .enumerate()
            .map(|(i, (st, ..))| tb.slice(i as u64 * part, 4 * u64::from(n * st.r_total)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for ((st, x, _), t) in active.iter().zip(&ts) {
            let ks = l.ad.kernel_stack(st);
            self.k
                .lora
                .record_shrink(chain, &ks, &mix, x, st.n_in, t, n)?;
        }
        chain.compute_barrier()?;
        for ((st, _, y), t) in active.iter().zip(&ts) {
            let ks = l.ad.kernel_stack(st);
            self.k
                .lora
                .record_expand(chain, &ks, &mix, t, y, st.n_out, 0, n)?;
        }
        Ok(())
    }

    /// `y (+)= x · mᵀ (+ bias)` over `n` tokens, one dispatch per piece of `m`; with `norm`
    /// (weight, eps) the product is of `rms_norm(x)` (fused in the matvec kernel), with
    /// `pending` of `rms_norm(x + rms_norm(p) * weight)` (the first piece settles the stream).
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        chain: &mut Chain,
        m: &GpuMatrix,
        x: &BufferSlice,
        y: &BufferSlice,
        n: u32,
        bias: Option<&BufferSlice>,
        accumulate: bool,
        norm: Option<(&BufferSlice, f32)>,
        pending: Option<PendingNorm>,
    ) -> Result<()> {
        let mut args = Vec::with_capacity(m.pieces.len());
        piece_args(&mut args, m, x, y, n, bias, accumulate, norm, pending)?;
        self.lin().record_many(chain, &args)?;
        Ok(())
    }

    /// [`Graph::linear`] of several matrices of one input (a block's Q, K and V: each
    /// `(matrix, y, bias, pending post-norm)`), recorded alike so that they can share one
    /// quantization of x (`StepLinear::record_many`).
    fn linear_many(
        &self,
        chain: &mut Chain,
        jobs: &[(
            &GpuMatrix,
            &BufferSlice,
            Option<&BufferSlice>,
            Option<PendingNorm>,
        )],
        x: &BufferSlice,
        n: u32,
        norm: Option<(&BufferSlice, f32)>,
    ) -> Result<()> {
        let mut args = Vec::new();
        for &(m, y, bias, pending) in jobs {
            piece_args(&mut args, m, x, y, n, bias, false, norm, pending)?;
        }
        self.lin().record_many(chain, &args)?;
        Ok(())
    }
}
