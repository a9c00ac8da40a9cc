//! Recording one layer's forward (also replayed during the backward to recompute its
//! activations from the saved residual stream), the loss head, and one layer's backward.

use octoflow_kernels::{GetRowsArgs, SoftmaxMask, Strides};
use octoflow_model::AttnPlan;
use octoflow_vk::{Buffer, BufferSlice, Chain};

use super::Trainer;
use crate::error::Result;

/// The first `n` floats of `b`.
pub(crate) fn f(b: &Buffer, n: usize) -> Result<BufferSlice> {
    Ok(b.slice(0, 4 * n as u64)?)
}

/// Which of a batch's attention products (see `Trainer::attn_mm`).
#[derive(Clone, Copy)]
pub(crate) enum Attn {
    /// `S = Q Kᵀ` per (sequence, head).
    Scores,
    /// `O = P V`.
    Out,
    /// `dP = dO Vᵀ`.
    DProbs,
    /// `dV = Pᵀ dO`, summed over the heads sharing a key head.
    DValues,
    /// `dQ = dS K`.
    DQueries,
    /// `dK = dSᵀ Q`, summed over the heads sharing a key head.
    DKeys,
}

impl Trainer {
    /// `xs[0] = token_embd[ids] · embedding_scale`.
    pub(crate) fn embed(&self, chain: &mut Chain) -> Result<()> {
        let w = self.gm.weights();
        let x = f(&self.b.xs[0], self.rows * self.c.n_embd)?;
        let ids = self.b.io.whole();
        for p in &w.token_embd.pieces {
            self.gm.kernels().get_rows.record(
                chain,
                &GetRowsArgs {
                    ty: w.token_embd.ty,
                    table: &p.slice,
                    n_cols: w.token_embd.n_cols,
                    row_begin: p.row_begin,
                    row_end: p.row_begin + p.n_rows,
                    ids: &ids,
                    ids_offset: self.io.ids as u32,
                    n_ids: self.rows as u32,
                    out: &x,
                    scale: self.c.embedding_scale,
                },
            )?;
        }
        chain.compute_barrier()?;
        Ok(())
    }

    /// The attention softmax of layer `il` (forward, in place on the scores) or its backward
    /// (in place on `dscores`, reading the probabilities).
    pub(crate) fn softmax(&self, chain: &mut Chain, plan: &AttnPlan, backward: bool) -> Result<()> {
        let c = &self.c;
        let pos = self.b.io.whole();
        let mask = SoftmaxMask {
            pos: &pos,
            pos_offset: self.io.pos as u32,
            pos_stride: 2,
            n_seq: self.batch as u32,
            n_head: c.n_head as u32,
            seq_len: self.seq_len as u32,
            window: plan.kind.window().map_or(0, |w| w as u32),
            scale: plan.scale,
        };
        let n = self.batch * c.n_head * self.seq_len * self.seq_len;
        let p = f(&self.b.scores, n)?;
        if backward {
            let dp = f(&self.b.dscores, n)?;
            self.tk.softmax.backward(chain, &p, &dp, &mask)?;
        } else {
            self.tk.softmax.forward(chain, &p, &mask)?;
        }
        Ok(())
    }

    /// Records a batched attention product (see [`Attn`]).
    pub(crate) fn attn_mm(&self, chain: &mut Chain, which: Attn) -> Result<()> {
        let c = &self.c;
        let (s, hn, hk) = (self.seq_len, c.n_head, c.n_head_kv);
        let g = c.gqa_group();
        let (hd, hdv) = (c.head_dim, c.head_dim_v);
        let (qd, kd, vd, ad) = (c.q_dim(), c.k_dim(), c.v_dim(), hn * hdv);
        let rows = self.rows;
        let ss = s * s;
        // per-(sequence, head) layouts of the row-major activations
        let act = |width: usize, head: usize| Strides {
            row: width as u32,
            col: 1,
            batch: [(s * width) as u32, head as u32],
            group: head as u32,
        };
        let act_t = |width: usize, head: usize| Strides {
            row: 1,
            col: width as u32,
            batch: [(s * width) as u32, head as u32],
            group: 0,
        };
        let probs = Strides {
            row: s as u32,
            col: 1,
            batch: [(hn * ss) as u32, ss as u32],
            group: 0,
        };
        // Pᵀ of the `g` heads of one key head: batch (sequence, key head), group = head in group
        let probs_t_grouped = Strides {
            row: 1,
            col: s as u32,
            batch: [(hn * ss) as u32, (g * ss) as u32],
            group: ss as u32,
        };
        let grouped = |width: usize, head: usize| Strides {
            row: width as u32,
            col: 1,
            batch: [(s * width) as u32, (g * head) as u32],
            group: head as u32,
        };
        let b = &self.b;
        let sc = f(&b.scores, self.batch * hn * ss)?;
        let dsc = f(&b.dscores, self.batch * hn * ss)?;
        type Op = (
            (BufferSlice, Strides),
            (BufferSlice, Strides),
            u32,
            (BufferSlice, usize, [u32; 2]),
            [usize; 3],
            u32,
            [usize; 2],
        );
        let op: Op = match which {
            Attn::Scores => (
                (f(&b.q, rows * qd)?, act(qd, hd)),
                (f(&b.k, rows * kd)?, act_t(kd, hd)),
                g as u32,
                (sc, s, [(hn * ss) as u32, ss as u32]),
                [s, s, hd],
                1,
                [self.batch, hn],
            ),
            Attn::Out => (
                (sc, probs),
                (f(&b.v, rows * vd)?, act(vd, hdv)),
                g as u32,
                (f(&b.att, rows * ad)?, ad, [(s * ad) as u32, hdv as u32]),
                [s, hdv, s],
                1,
                [self.batch, hn],
            ),
            Attn::DProbs => (
                (f(&b.datt, rows * ad)?, act(ad, hdv)),
                (f(&b.v, rows * vd)?, act_t(vd, hdv)),
                g as u32,
                (dsc, s, [(hn * ss) as u32, ss as u32]),
                [s, s, hdv],
                1,
                [self.batch, hn],
            ),
            Attn::DValues => (
                (sc, probs_t_grouped),
                (f(&b.datt, rows * ad)?, grouped(ad, hdv)),
                1,
                (f(&b.dv, rows * vd)?, vd, [(s * vd) as u32, hdv as u32]),
                [s, hdv, s],
                g as u32,
                [self.batch, hk],
            ),
            Attn::DQueries => (
                (dsc, probs),
                (f(&b.k, rows * kd)?, act(kd, hd)),
                g as u32,
                (f(&b.dq, rows * qd)?, qd, [(s * qd) as u32, hd as u32]),
                [s, hd, s],
                1,
                [self.batch, hn],
            ),
            Attn::DKeys => (
                (dsc, probs_t_grouped),
                (f(&b.q, rows * qd)?, grouped(qd, hd)),
                1,
                (f(&b.dk, rows * kd)?, kd, [(s * kd) as u32, hd as u32]),
                [s, hd, s],
                g as u32,
                [self.batch, hk],
            ),
        };
        let ((a, a_s), (bb, b_s), b_div, (cc, c_row, c_batch), [m, n, k], groups, batch) = op;
        self.tk.gemm.record(
            chain,
            &octoflow_kernels::GemmArgs {
                a: &a,
                a_s,
                b: &bb,
                b_s,
                b_div,
                c: &cc,
                c_row: c_row as u32,
                c_batch,
                m: m as u32,
                n: n as u32,
                k: k as u32,
                groups,
                batch: [batch[0] as u32, batch[1] as u32],
                alpha: 1.0,
                beta: 0.0,
            },
        )?;
        Ok(())
    }
}
