//! One layer's forward (keeping what its backward reads) and backward on the CPU, the same
//! steps as the GPU step (`gpu/block.rs`; gemma3's extra norms in brackets):
//! `n1 = norm(x)`, `q,k,v = W n1 + lora` [`q,k = head_norm(q,k)`], `q,k = rope(q,k)`,
//! `att = softmax(q kᵀ) v`, `a = Wo att + lora` [`a = post_norm(a)`], `xmid = x + a`,
//! `n2 = norm(xmid)`, `g,u = W n2 + lora`, `hg = act(g) u`, `f = Wd hg + lora`
//! [`f = post_norm(f)`], `out = xmid + f`.

use super::adapters::{linear, linear_t};
use super::attention::{self, Shape};
use super::ops;
use super::CpuTrainer;
use crate::gpu::Rows;
use crate::lora::Target;

/// A layer's activations, as its backward reads them.
pub(crate) struct Acts {
    pub n1: Vec<f32>,
    /// q and k before their per-head norms (empty without them).
    pub q_raw: Vec<f32>,
    pub k_raw: Vec<f32>,
    /// After the norms and RoPE.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub probs: Vec<f32>,
    pub att: Vec<f32>,
    /// The attention output before its post-norm (empty without one).
    pub a_raw: Vec<f32>,
    pub xmid: Vec<f32>,
    pub n2: Vec<f32>,
    pub g: Vec<f32>,
    pub u: Vec<f32>,
    pub hg: Vec<f32>,
    pub f_raw: Vec<f32>,
    /// Each adapter's `x Aᵀ`, by `Target as usize` (empty where the run has none).
    pub h: Vec<Vec<f32>>,
}

impl Acts {
    pub fn bytes(&self) -> u64 {
        let v = [
            &self.n1,
            &self.q_raw,
            &self.k_raw,
            &self.q,
            &self.k,
            &self.v,
            &self.probs,
            &self.att,
            &self.a_raw,
            &self.xmid,
            &self.n2,
            &self.g,
            &self.u,
            &self.hg,
            &self.f_raw,
        ];
        let h: usize = self.h.iter().map(Vec::len).sum();
        4 * (v.iter().map(|x| x.len()).sum::<usize>() + h) as u64
    }
}

/// `a + b`.
fn sum(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

impl CpuTrainer {
    fn shape(&self, il: usize) -> Shape {
        let c = &self.c;
        let plan = &self.base.layers[il].attn;
        Shape {
            batch: self.batch,
            seq: self.seq_len,
            n_head: c.n_head,
            n_kv: c.n_head_kv,
            hd: c.head_dim,
            hdv: c.head_dim_v,
            scale: plan.scale,
            window: plan.kind.window().unwrap_or(0),
        }
    }

    /// RoPE on `x` `[T, heads · head_dim]` at the rows' positions (`inverse` for gradients).
    fn rope(&self, il: usize, x: &mut [f32], pos: &[u32], inverse: bool) {
        let l = &self.base.layers[il];
        let max = pos.iter().copied().max().unwrap_or(0);
        let table = ops::rope_table(&l.freqs, max);
        let pairs = l.freqs.len();
        ops::rope(
            x,
            self.c.head_dim,
            l.attn.rope.kind,
            &table,
            pairs,
            pos,
            inverse,
        );
    }

    /// Layer `il`'s forward from `x`: its output and its activations. `seed`: the dropout
    /// masks' while training (evaluation has none).
    pub(crate) fn layer_forward(
        &self,
        il: usize,
        x: &[f32],
        r: &Rows,
        seed: Option<u32>,
    ) -> (Vec<f32>, Acts) {
        let c = &self.c;
        let l = &self.base.layers[il];
        let t = self.rows;
        let (d, ff, eps) = (c.n_embd, c.n_ff, c.rms_eps);
        let mut h: Vec<Vec<f32>> = vec![Vec::new(); Target::ALL.len()];
        let mut n1 = vec![0f32; t * d];
        ops::rms_norm(x, &l.attn_norm, &mut n1, d, eps);
        let proj = |target: Target, w, bias: &Option<Vec<f32>>, h: &mut Vec<Vec<f32>>| {
            let w: &super::weights::Dense = w;
            let mut y = vec![0f32; t * w.rows];
            linear(w, &n1, &mut y, bias.as_deref());
            h[target as usize] = self.lora_forward(il, target, &n1, &mut y, seed);
            y
        };
        let mut q = proj(Target::Q, &l.q, &l.bias[0], &mut h);
        let mut k = proj(Target::K, &l.k, &l.bias[1], &mut h);
        let v = proj(Target::V, &l.v, &l.bias[2], &mut h);
        let (mut q_raw, mut k_raw) = (Vec::new(), Vec::new());
        if let Some((qn, kn)) = &l.qk_norm {
            let hd = c.head_dim;
            q_raw = std::mem::take(&mut q);
            k_raw = std::mem::take(&mut k);
            q = vec![0f32; q_raw.len()];
            k = vec![0f32; k_raw.len()];
            ops::rms_norm(&q_raw, qn, &mut q, hd, eps);
            ops::rms_norm(&k_raw, kn, &mut k, hd, eps);
        }
        self.rope(il, &mut q, &r.pos, false);
        self.rope(il, &mut k, &r.pos, false);
        let sh = self.shape(il);
        let mut probs = vec![0f32; sh.probs()];
        let mut att = vec![0f32; t * c.n_head * c.head_dim_v];
        attention::forward(&sh, &r.pos, (&q, &k, &v), &mut probs, &mut att);
        let mut a = vec![0f32; t * d];
        linear(&l.o, &att, &mut a, None);
        h[Target::O as usize] = self.lora_forward(il, Target::O, &att, &mut a, seed);
        let mut a_raw = Vec::new();
        if let Some(pn) = &l.post_attn {
            a_raw = a;
            a = vec![0f32; t * d];
            ops::rms_norm(&a_raw, pn, &mut a, d, eps);
        }
        let xmid = sum(x, &a);
        drop(a);
        let mut n2 = vec![0f32; t * d];
        ops::rms_norm(&xmid, &l.ffn_norm, &mut n2, d, eps);
        let (mut g, mut u) = (vec![0f32; t * ff], vec![0f32; t * ff]);
        linear(&l.gate, &n2, &mut g, None);
        h[Target::Gate as usize] = self.lora_forward(il, Target::Gate, &n2, &mut g, seed);
        linear(&l.up, &n2, &mut u, None);
        h[Target::Up as usize] = self.lora_forward(il, Target::Up, &n2, &mut u, seed);
        let mut hg = vec![0f32; t * ff];
        ops::glu(&g, &u, &mut hg, l.act);
        let mut f = vec![0f32; t * d];
        linear(&l.down, &hg, &mut f, None);
        h[Target::Down as usize] = self.lora_forward(il, Target::Down, &hg, &mut f, seed);
        let mut f_raw = Vec::new();
        if let Some(pn) = &l.post_ffw {
            f_raw = f;
            f = vec![0f32; t * d];
            ops::rms_norm(&f_raw, pn, &mut f, d, eps);
        }
        let out = sum(&xmid, &f);
        let acts = Acts {
            n1,
            q_raw,
            k_raw,
            q,
            k,
            v,
            probs,
            att,
            a_raw,
            xmid,
            n2,
            g,
            u,
            hg,
            f_raw,
            h,
        };
        (out, acts)
    }

    /// Layer `il`'s backward: `dx` holds ∂L/∂out and becomes ∂L/∂x (`x` the layer's input);
    /// the adapters' gradients accumulate.
    pub(crate) fn layer_backward(
        &mut self,
        il: usize,
        x: &[f32],
        a: &Acts,
        dx: &mut [f32],
        r: &Rows,
        seed: u32,
    ) {
        let base = std::sync::Arc::clone(&self.base);
        let l = &base.layers[il];
        let t = self.rows;
        let (d, ff, eps, hd) = (self.c.n_embd, self.c.n_ff, self.c.rms_eps, self.c.head_dim);
        // ---- feed-forward: dx is ∂L/∂f (residual) ----
        let df = match &l.post_ffw {
            Some(pn) => {
                let mut o = vec![0f32; t * d];
                ops::rms_norm_back(&a.f_raw, pn, dx, &mut o, d, eps, false);
                o
            }
            None => dx.to_vec(),
        };
        let mut dhg = vec![0f32; t * ff];
        linear_t(&l.down, &df, &mut dhg, false);
        let hh = |tg: Target| &a.h[tg as usize];
        self.lora_backward(
            il,
            Target::Down,
            &a.hg,
            hh(Target::Down),
            &df,
            &mut dhg,
            seed,
        );
        drop(df);
        let (mut dg, mut du) = (vec![0f32; t * ff], vec![0f32; t * ff]);
        ops::glu_back(&a.g, &a.u, &dhg, &mut dg, &mut du, l.act);
        drop(dhg);
        let mut dn = vec![0f32; t * d];
        linear_t(&l.gate, &dg, &mut dn, false);
        linear_t(&l.up, &du, &mut dn, true);
        self.lora_backward(
            il,
            Target::Gate,
            &a.n2,
            hh(Target::Gate),
            &dg,
            &mut dn,
            seed,
        );
        self.lora_backward(il, Target::Up, &a.n2, hh(Target::Up), &du, &mut dn, seed);
        drop((dg, du));
        ops::rms_norm_back(&a.xmid, &l.ffn_norm, &dn, dx, d, eps, true);
        // ---- attention: dx is now ∂L/∂xmid ----
        let da = match &l.post_attn {
            Some(pn) => {
                let mut o = vec![0f32; t * d];
                ops::rms_norm_back(&a.a_raw, pn, dx, &mut o, d, eps, false);
                o
            }
            None => dx.to_vec(),
        };
        let mut datt = vec![0f32; a.att.len()];
        linear_t(&l.o, &da, &mut datt, false);
        self.lora_backward(il, Target::O, &a.att, hh(Target::O), &da, &mut datt, seed);
        drop(da);
        let sh = self.shape(il);
        let (mut dq, mut dk, mut dv) = (
            vec![0f32; a.q.len()],
            vec![0f32; a.k.len()],
            vec![0f32; a.v.len()],
        );
        let qkv = (&a.q[..], &a.k[..], &a.v[..]);
        attention::backward(&sh, &r.pos, qkv, &a.probs, &datt, &mut dq, &mut dk, &mut dv);
        drop(datt);
        self.rope(il, &mut dq, &r.pos, true);
        self.rope(il, &mut dk, &r.pos, true);
        if let Some((qn, kn)) = &l.qk_norm {
            let mut o = vec![0f32; dq.len()];
            ops::rms_norm_back(&a.q_raw, qn, &dq, &mut o, hd, eps, false);
            dq = o;
            let mut o = vec![0f32; dk.len()];
            ops::rms_norm_back(&a.k_raw, kn, &dk, &mut o, hd, eps, false);
            dk = o;
        }
        linear_t(&l.q, &dq, &mut dn, false);
        linear_t(&l.k, &dk, &mut dn, true);
        linear_t(&l.v, &dv, &mut dn, true);
        self.lora_backward(il, Target::Q, &a.n1, hh(Target::Q), &dq, &mut dn, seed);
        self.lora_backward(il, Target::K, &a.n1, hh(Target::K), &dk, &mut dn, seed);
        self.lora_backward(il, Target::V, &a.n1, hh(Target::V), &dv, &mut dn, seed);
        ops::rms_norm_back(x, &l.attn_norm, &dn, dx, d, eps, true);
    }
}
