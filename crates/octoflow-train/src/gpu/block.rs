//! One layer's forward and backward, and the loss head, as recordings.
//!
//! Forward of layer `l` from `x = xs[l]` (gemma3's extra norms in brackets):
//! `n1 = norm(x)`, `q,k,v = W n1 + lora` [`q,k = head_norm(q,k)`], `q,k = rope(q,k)`,
//! `P = softmax(q kᵀ)`, `att = P v`, `a = Wo att + lora` [`a = post_norm(a)`], `xmid = x + a`,
//! `n2 = norm(xmid)`, `g,u = W n2 + lora`, `hg = act(g) u`, `f = Wd hg + lora`
//! [`f = post_norm(f)`], `xs[l + 1] = xmid + f`. The backward walks the same steps in reverse.

use octoflow_kernels::{CrossEntropyArgs, Positions, RopeArgs};
use octoflow_model::gpu::kernels::{glu_op, rope_mode};
use octoflow_model::gpu::weights::GpuMatrix;
use octoflow_model::plan::{planned, qk_norms};
use octoflow_vk::{Buffer, BufferSlice, Chain};

use super::layer::{f, Attn};
use super::Trainer;
use crate::error::Result;
use crate::lora::Target;

impl Trainer {
    /// RoPE on q and k (or, `inverse`, the transposed rotation on dq and dk) of layer `il`.
    fn rope(&self, chain: &mut Chain, il: usize, inverse: bool) -> Result<()> {
        let c = &self.c;
        let (qb, kb) = if inverse {
            (&self.b.dq, &self.b.dk)
        } else {
            (&self.b.q, &self.b.k)
        };
        let mode = rope_mode(self.c.blocks[il].attn.rope.kind);
        let pos = self.b.io.whole();
        for (buf, heads) in [(qb, c.n_head), (kb, c.n_head_kv)] {
            let x = f(buf, self.rows * heads * c.head_dim)?;
            self.gm.kernels().rope.record(
                chain,
                &RopeArgs {
                    x: &x,
                    n_tokens: self.rows as u32,
                    n_heads: heads as u32,
                    head_dim: c.head_dim as u32,
                    mode,
                    freqs: &self.gm.weights().blk[il].rope,
                    pos: &pos,
                    pos_offset: self.io.pos as u32,
                    positions: Positions::Table,
                    inverse,
                },
            )?;
        }
        Ok(())
    }

    /// `out = post_norm(m x + lora)` for the projection `m` (adapter `target`) of layer `il`
    /// into `[T, n_embd]`; with a post-norm (gemma3) the projection first lands in `raw`,
    /// which the backward reads. Returns `out`.
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        chain: &mut Chain,
        il: usize,
        (target, m): (Target, &GpuMatrix),
        x: &BufferSlice,
        (raw, out): (&Buffer, &Buffer),
        post_norm: Option<&BufferSlice>,
        train: bool,
    ) -> Result<BufferSlice> {
        let (c, t) = (&self.c, self.rows);
        let out = f(out, t * c.n_embd)?;
        let y = match post_norm {
            Some(_) => f(raw, t * c.n_embd)?,
            None => out.clone(),
        };
        self.linear(chain, m, x, &y, t as u32, None)?;
        chain.compute_barrier()?;
        self.lora_forward(chain, il, target, x, &y, train)?;
        chain.compute_barrier()?;
        if let Some(pn) = post_norm {
            let (n, eps) = (c.n_embd as u32, c.rms_eps);
            self.gm
                .kernels()
                .rms_norm
                .record(chain, &y, pn, &out, t as u32, n, eps)?;
            chain.compute_barrier()?;
        }
        Ok(out)
    }

    /// `dx = dy·W + the adapter's share` (and the adapter's gradients) for a projection of layer
    /// `il` whose input was `x`.
    #[allow(clippy::too_many_arguments)]
    fn project_back(
        &self,
        chain: &mut Chain,
        il: usize,
        target: Target,
        m: &GpuMatrix,
        x: &BufferSlice,
        dy: &BufferSlice,
        dx: &BufferSlice,
    ) -> Result<()> {
        self.linear_t(chain, m, dy, dx, self.rows as u32, false)?;
        chain.compute_barrier()?;
        self.lora_backward(chain, il, target, x, dy, dx)?;
        chain.compute_barrier()?;
        Ok(())
    }

    /// Records layer `il`'s forward from `xs[il]`. With `save` the output goes to
    /// `xs[il + 1]`; without, only the activations the backward needs are (re)computed.
    /// `train`: the adapters' inputs go through dropout (evaluation has none).
    pub(crate) fn layer_forward(
        &self,
        chain: &mut Chain,
        il: usize,
        save: bool,
        train: bool,
    ) -> Result<()> {
        let (c, b, t) = (&self.c, &self.b, self.rows);
        let k = self.gm.kernels();
        let lw = &self.gm.weights().blk[il];
        let (plan, glu) = (&c.blocks[il].attn, c.blocks[il].glu()?);
        let gw = lw.glu()?;
        let (d, ff, eps) = (c.n_embd, c.n_ff, c.rms_eps);
        let (qd, kd, vd, ad) = (c.q_dim(), c.k_dim(), c.v_dim(), c.n_head * c.head_dim_v);
        let x = f(&b.xs[il], t * d)?;
        let n1 = f(&b.n1, t * d)?;
        let (q, kk, v) = (f(&b.q, t * qd)?, f(&b.k, t * kd)?, f(&b.v, t * vd)?);
        k.rms_norm
            .record(chain, &x, &lw.attn_norm, &n1, t as u32, d as u32, eps)?;
        chain.compute_barrier()?;
        // with per-head norms, the projections land in q_raw/k_raw first
        let qk_norm = qk_norms(il, plan, &lw.attn_q_norm, &lw.attn_k_norm)?;
        let (qp, kp) = if qk_norm.is_some() {
            (f(&b.q_raw, t * qd)?, f(&b.k_raw, t * kd)?)
        } else {
            (q.clone(), kk.clone())
        };
        self.linear(
            chain,
            &lw.attn_q,
            &n1,
            &qp,
            t as u32,
            lw.attn_q_bias.as_ref(),
        )?;
        self.linear(
            chain,
            &lw.attn_k,
            &n1,
            &kp,
            t as u32,
            lw.attn_k_bias.as_ref(),
        )?;
        self.linear(
            chain,
            &lw.attn_v,
            &n1,
            &v,
            t as u32,
            lw.attn_v_bias.as_ref(),
        )?;
        chain.compute_barrier()?;
        self.lora_forward(chain, il, Target::Q, &n1, &qp, train)?;
        self.lora_forward(chain, il, Target::K, &n1, &kp, train)?;
        self.lora_forward(chain, il, Target::V, &n1, &v, train)?;
        chain.compute_barrier()?;
        if let Some((qn, kn)) = qk_norm {
            let hd = c.head_dim as u32;
            k.rms_norm
                .record(chain, &qp, qn, &q, (t * c.n_head) as u32, hd, eps)?;
            k.rms_norm
                .record(chain, &kp, kn, &kk, (t * c.n_head_kv) as u32, hd, eps)?;
            chain.compute_barrier()?;
        }
        self.rope(chain, il, false)?;
        chain.compute_barrier()?;
        self.attn_mm(chain, Attn::Scores)?;
        chain.compute_barrier()?;
        self.softmax(chain, plan, false)?;
        chain.compute_barrier()?;
        self.attn_mm(chain, Attn::Out)?;
        chain.compute_barrier()?;
        let att = f(&b.att, t * ad)?;
        let xmid = f(&b.xmid, t * d)?;
        let a = self.project(
            chain,
            il,
            (Target::O, &lw.attn_output),
            &att,
            (&b.a_raw, &b.a),
            planned(
                il,
                plan.post_norm,
                &lw.post_attention_norm,
                "post_attention_norm",
            )?,
            train,
        )?;
        k.add.record(chain, &x, &a, &xmid, (t * d) as u32)?;
        chain.compute_barrier()?;
        // feed-forward
        let n2 = f(&b.n2, t * d)?;
        let (g, u, hg) = (f(&b.g, t * ff)?, f(&b.u, t * ff)?, f(&b.hg, t * ff)?);
        k.rms_norm
            .record(chain, &xmid, &lw.ffn_norm, &n2, t as u32, d as u32, eps)?;
        chain.compute_barrier()?;
        self.linear(chain, &gw.ffn_gate, &n2, &g, t as u32, None)?;
        self.linear(chain, &gw.ffn_up, &n2, &u, t as u32, None)?;
        chain.compute_barrier()?;
        self.lora_forward(chain, il, Target::Gate, &n2, &g, train)?;
        self.lora_forward(chain, il, Target::Up, &n2, &u, train)?;
        chain.compute_barrier()?;
        k.glu
            .record(chain, &g, &u, &hg, (t * ff) as u32, glu_op(glu.act))?;
        chain.compute_barrier()?;
        let fo = self.project(
            chain,
            il,
            (Target::Down, &gw.ffn_down),
            &hg,
            (&b.f_raw, &b.f),
            planned(il, glu.post_norm, &lw.post_ffw_norm, "post_ffw_norm")?,
            train,
        )?;
        if save {
            let out = f(&b.xs[il + 1], t * d)?;
            k.add.record(chain, &xmid, &fo, &out, (t * d) as u32)?;
            chain.compute_barrier()?;
        }
        Ok(())
    }

    /// Final norm, vocabulary projection and cross-entropy, chunk by chunk of rows; with
    /// `train`, also the gradient back to the final norm's input, into `dx`.
    pub(crate) fn head(&self, chain: &mut Chain, train: bool) -> Result<()> {
        let (c, b, t) = (&self.c, &self.b, self.rows);
        let k = self.gm.kernels();
        let w = self.gm.weights();
        let d = c.n_embd;
        let x = f(&b.xs[c.n_layer], t * d)?;
        let nf = f(&b.nf, t * d)?;
        k.rms_norm.record(
            chain,
            &x,
            &w.output_norm,
            &nf,
            t as u32,
            d as u32,
            c.rms_eps,
        )?;
        chain.compute_barrier()?;
        let io = b.io.whole();
        let row = 4 * d as u64;
        let mut r0 = 0;
        while r0 < t {
            let n = self.logit_rows.min(t - r0);
            let xs = b.nf.slice(r0 as u64 * row, n as u64 * row)?;
            let logits = f(&b.logits, n * c.n_vocab)?;
            self.linear(chain, &w.output, &xs, &logits, n as u32, None)?;
            chain.compute_barrier()?;
            let loss = b.loss.slice(4 * r0 as u64, 4 * n as u64)?;
            self.tk.cross_entropy.record(
                chain,
                &CrossEntropyArgs {
                    logits: &logits,
                    labels: &io,
                    labels_offset: (self.io.labels + r0) as u32,
                    weights: &io,
                    weights_offset: (self.io.weights + r0) as u32,
                    loss: &loss,
                    n_rows: n as u32,
                    n_vocab: c.n_vocab as u32,
                },
            )?;
            chain.compute_barrier()?;
            if train {
                let dxs = b.dnf.slice(r0 as u64 * row, n as u64 * row)?;
                self.linear_t(chain, &w.output, &logits, &dxs, n as u32, false)?;
                chain.compute_barrier()?;
            }
            r0 += n;
        }
        if train {
            let dnf = f(&b.dnf, t * d)?;
            let dx = f(&b.dx, t * d)?;
            self.tk.rms_norm_back.record(
                chain,
                &x,
                &w.output_norm,
                &dnf,
                &dx,
                t as u32,
                d as u32,
                c.rms_eps,
                false,
            )?;
            chain.compute_barrier()?;
        }
        Ok(())
    }

    /// `dy` through a post-norm (gemma3) into `tmp`, or `dy` itself without one.
    fn through_post_norm(
        &self,
        chain: &mut Chain,
        norm: Option<&BufferSlice>,
        raw: &Buffer,
        dy: &BufferSlice,
    ) -> Result<BufferSlice> {
        let (c, t) = (&self.c, self.rows);
        let Some(w) = norm else {
            return Ok(dy.clone());
        };
        let d = c.n_embd;
        let out = f(&self.b.dtmp, t * d)?;
        let raw = f(raw, t * d)?;
        self.tk.rms_norm_back.record(
            chain, &raw, w, dy, &out, t as u32, d as u32, c.rms_eps, false,
        )?;
        chain.compute_barrier()?;
        Ok(out)
    }

    /// Records layer `il`'s backward: `dx` holds ∂L/∂xs[il + 1] and is turned into
    /// ∂L/∂xs[il]; the adapters' gradients accumulate. The layer's activations must be in the
    /// scratch (its forward recorded just before).
    pub(crate) fn layer_backward(&self, chain: &mut Chain, il: usize) -> Result<()> {
        let (c, b, t) = (&self.c, &self.b, self.rows);
        let lw = &self.gm.weights().blk[il];
        let (plan, glu) = (&c.blocks[il].attn, c.blocks[il].glu()?);
        let gw = lw.glu()?;
        let post_ffw = planned(il, glu.post_norm, &lw.post_ffw_norm, "post_ffw_norm")?;
        let post_attn = planned(
            il,
            plan.post_norm,
            &lw.post_attention_norm,
            "post_attention_norm",
        )?;
        let (d, ff, eps) = (c.n_embd, c.n_ff, c.rms_eps);
        let (qd, kd, vd, ad) = (c.q_dim(), c.k_dim(), c.v_dim(), c.n_head * c.head_dim_v);
        let tu = t as u32;
        let dx = f(&b.dx, t * d)?;
        // ---- feed-forward: dx is ∂L/∂out = ∂L/∂f (residual) ----
        let df = self.through_post_norm(chain, post_ffw, &b.f_raw, &dx)?;
        let (g, u, hg, dhg) = (
            f(&b.g, t * ff)?,
            f(&b.u, t * ff)?,
            f(&b.hg, t * ff)?,
            f(&b.dhg, t * ff)?,
        );
        self.project_back(chain, il, Target::Down, &gw.ffn_down, &hg, &df, &dhg)?;
        // dg, du in place over g, u (their values are not needed after this)
        self.tk.glu_back.record(
            chain,
            &g,
            &u,
            &dhg,
            &g,
            &u,
            (t * ff) as u32,
            glu_op(glu.act),
        )?;
        chain.compute_barrier()?;
        let (n2, dn) = (f(&b.n2, t * d)?, f(&b.dn, t * d)?);
        self.linear_t(chain, &gw.ffn_gate, &g, &dn, tu, false)?;
        chain.compute_barrier()?;
        self.linear_t(chain, &gw.ffn_up, &u, &dn, tu, true)?;
        chain.compute_barrier()?;
        self.lora_backward(chain, il, Target::Gate, &n2, &g, &dn)?;
        chain.compute_barrier()?;
        self.lora_backward(chain, il, Target::Up, &n2, &u, &dn)?;
        chain.compute_barrier()?;
        let xmid = f(&b.xmid, t * d)?;
        self.tk.rms_norm_back.record(
            chain,
            &xmid,
            &lw.ffn_norm,
            &dn,
            &dx,
            tu,
            d as u32,
            eps,
            true,
        )?;
        chain.compute_barrier()?;
        // ---- attention: dx is now ∂L/∂xmid ----
        let da = self.through_post_norm(chain, post_attn, &b.a_raw, &dx)?;
        let (att, datt) = (f(&b.att, t * ad)?, f(&b.datt, t * ad)?);
        self.project_back(chain, il, Target::O, &lw.attn_output, &att, &da, &datt)?;
        self.attn_mm(chain, Attn::DProbs)?;
        self.attn_mm(chain, Attn::DValues)?;
        chain.compute_barrier()?;
        self.softmax(chain, plan, true)?;
        chain.compute_barrier()?;
        self.attn_mm(chain, Attn::DQueries)?;
        self.attn_mm(chain, Attn::DKeys)?;
        chain.compute_barrier()?;
        self.rope(chain, il, true)?;
        chain.compute_barrier()?;
        let (dq, dk, dv) = (f(&b.dq, t * qd)?, f(&b.dk, t * kd)?, f(&b.dv, t * vd)?);
        if let Some((qn, kn)) = qk_norms(il, plan, &lw.attn_q_norm, &lw.attn_k_norm)? {
            let hd = c.head_dim as u32;
            let (qr, kr) = (f(&b.q_raw, t * qd)?, f(&b.k_raw, t * kd)?);
            self.tk.rms_norm_back.record(
                chain,
                &qr,
                qn,
                &dq,
                &dq,
                tu * c.n_head as u32,
                hd,
                eps,
                false,
            )?;
            self.tk.rms_norm_back.record(
                chain,
                &kr,
                kn,
                &dk,
                &dk,
                tu * c.n_head_kv as u32,
                hd,
                eps,
                false,
            )?;
            chain.compute_barrier()?;
        }
        let n1 = f(&b.n1, t * d)?;
        self.linear_t(chain, &lw.attn_q, &dq, &dn, tu, false)?;
        chain.compute_barrier()?;
        self.linear_t(chain, &lw.attn_k, &dk, &dn, tu, true)?;
        chain.compute_barrier()?;
        self.linear_t(chain, &lw.attn_v, &dv, &dn, tu, true)?;
        chain.compute_barrier()?;
        self.lora_backward(chain, il, Target::Q, &n1, &dq, &dn)?;
        chain.compute_barrier()?;
        self.lora_backward(chain, il, Target::K, &n1, &dk, &dn)?;
        chain.compute_barrier()?;
        self.lora_backward(chain, il, Target::V, &n1, &dv, &dn)?;
        chain.compute_barrier()?;
        let x = f(&b.xs[il], t * d)?;
        self.tk.rms_norm_back.record(
            chain,
            &x,
            &lw.attn_norm,
            &dn,
            &dx,
            tu,
            d as u32,
            eps,
            true,
        )?;
        chain.compute_barrier()?;
        Ok(())
    }
}
