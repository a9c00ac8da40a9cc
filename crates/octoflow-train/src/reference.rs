//! The CPU reference of the training loss: the whole forward with adapters, in f64 over
//! dequantized weights, written plainly. The gradient tests take central finite differences
//! of this function and compare them with the GPU's backward.

use octoflow_kernels::dropout_uniform;
use octoflow_model::plan::planned;
use octoflow_model::{Activation, AttnPlan, Model, RopePlan, RopeType};

use crate::error::Result;
use crate::gpu::Rows;
use crate::lora::{LoraLayout, Target};

/// A dequantized `[rows, cols]` matrix.
struct Mat {
    rows: usize,
    cols: usize,
    w: Vec<f64>,
}

impl Mat {
    fn of(q: &octoflow_model::QMatrix) -> Result<Self> {
        let mut w = vec![0f32; q.n_rows * q.n_cols];
        q.dequantize_rows(0, &mut w)?;
        Ok(Mat {
            rows: q.n_rows,
            cols: q.n_cols,
            w: w.into_iter().map(f64::from).collect(),
        })
    }

    /// `y[t] = W x[t]` for every row of `x` (`[T, cols]` → `[T, rows]`).
    fn apply(&self, x: &[f64]) -> Vec<f64> {
        let t = x.len() / self.cols;
        let mut y = vec![0.0; t * self.rows];
        for (xr, yr) in x.chunks_exact(self.cols).zip(y.chunks_exact_mut(self.rows)) {
            for (o, yo) in yr.iter_mut().enumerate() {
                let wr = &self.w[o * self.cols..(o + 1) * self.cols];
                *yo = wr.iter().zip(xr).map(|(a, b)| a * b).sum();
            }
        }
        y
    }
}

fn v64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// One block's dequantized weights.
struct Block {
    attn_norm: Vec<f64>,
    q: Mat,
    k: Mat,
    v: Mat,
    biases: [Option<Vec<f64>>; 3],
    /// Empty where the plan has no such step.
    q_norm: Vec<f64>,
    k_norm: Vec<f64>,
    o: Mat,
    post_attn: Vec<f64>,
    ffn_norm: Vec<f64>,
    gate: Mat,
    up: Mat,
    down: Mat,
    post_ffw: Vec<f64>,
    /// The feed-forward's plan (the only kind this reference runs).
    glu: octoflow_model::GluPlan,
}

/// A model dequantized to f64 for the reference loss.
pub struct RefModel<'a> {
    model: &'a Model,
    embd: Mat,
    out_norm: Vec<f64>,
    out: Mat,
    blocks: Vec<Block>,
}

fn rmsnorm(x: &mut [f64], w: &[f64], eps: f64) {
    let n = w.len();
    for r in x.chunks_exact_mut(n) {
        let ms = r.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let s = 1.0 / (ms + eps).sqrt();
        for (v, wi) in r.iter_mut().zip(w) {
            *v *= s * wi;
        }
    }
}

impl<'a> RefModel<'a> {
    /// Dequantizes every weight of `model`.
    pub fn new(model: &'a Model) -> Result<Self> {
        let w = &model.weights;
        let blocks = w
            .blk
            .iter()
            .zip(&model.config.blocks)
            .enumerate()
            .map(|(il, (b, plan))| {
                if let Some(missing) = plan.train_missing() {
                    // the reference mirrors the GPU training step, which refuses the same
                    return Err(octoflow_model::ModelError::Unsupported(format!(
                        "the f64 training reference does not run {missing}"
                    ))
                    .into());
                }
                let (ap, glu, gw) = (&plan.attn, plan.glu()?, b.glu()?);
                let norm = |on, t: &Option<Vec<f32>>, name| -> Result<Vec<f64>> {
                    Ok(planned(il, on, t, name)?.map_or_else(Vec::new, |v| v64(v)))
                };
                Ok(Block {
                    attn_norm: v64(&b.attn_norm),
                    q: Mat::of(&b.attn_q)?,
                    k: Mat::of(&b.attn_k)?,
                    v: Mat::of(&b.attn_v)?,
                    biases: [
                        b.attn_q_bias.as_deref().map(v64),
                        b.attn_k_bias.as_deref().map(v64),
                        b.attn_v_bias.as_deref().map(v64),
                    ],
                    q_norm: norm(ap.qk_norm, &b.attn_q_norm, "attn_q_norm")?,
                    k_norm: norm(ap.qk_norm, &b.attn_k_norm, "attn_k_norm")?,
                    o: Mat::of(&b.attn_output)?,
                    post_attn: norm(ap.post_norm, &b.post_attention_norm, "post_attention_norm")?,
                    ffn_norm: v64(&b.ffn_norm),
                    gate: Mat::of(&gw.ffn_gate)?,
                    up: Mat::of(&gw.ffn_up)?,
                    down: Mat::of(&gw.ffn_down)?,
                    post_ffw: norm(glu.post_norm, &b.post_ffw_norm, "post_ffw_norm")?,
                    glu: *glu,
                })
            })
            .collect::<Result<_>>()?;
        Ok(RefModel {
            model,
            embd: Mat::of(&w.token_embd)?,
            out_norm: v64(&w.output_norm),
            out: Mat::of(&w.output)?,
            blocks,
        })
    }

    /// `y += scale · B (A dropout(x))` for the adapter on `target` of `layer`, with the
    /// trainer's mask (`dropout_uniform(seed, salt, i) >= p` keeps element `i` of `x`).
    #[allow(clippy::too_many_arguments)]
    fn lora(
        &self,
        lay: &LoraLayout,
        p: &[f64],
        l: usize,
        t: Target,
        x: &[f64],
        y: &mut [f64],
        drop: (f32, u32),
    ) {
        let Some(e) = lay.get(l, t) else {
            return;
        };
        let (prob, seed) = drop;
        let dropped: Vec<f64>;
        let x = if prob > 0.0 {
            let salt = (l * crate::gpu::TARGET_SLOTS + t as usize) as u32;
            let keep = 1.0 / (1.0 - prob);
            dropped = x
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    if dropout_uniform(seed, salt, i as u32) >= prob {
                        v * f64::from(keep)
                    } else {
                        0.0
                    }
                })
                .collect();
            &dropped[..]
        } else {
            x
        };
        let r = lay.rank;
        let a = &p[e.a..e.a + r * e.n_in];
        let b = &p[e.b..e.b + e.n_out * r];
        let s = f64::from(lay.scale);
        for (xr, yr) in x.chunks_exact(e.n_in).zip(y.chunks_exact_mut(e.n_out)) {
            let h: Vec<f64> = (0..r)
                .map(|j| {
                    let ar = &a[j * e.n_in..(j + 1) * e.n_in];
                    ar.iter().zip(xr).map(|(w, v)| w * v).sum()
                })
                .collect();
            for (o, yo) in yr.iter_mut().enumerate() {
                let br = &b[o * r..(o + 1) * r];
                *yo += s * br.iter().zip(&h).map(|(w, v)| w * v).sum::<f64>();
            }
        }
    }

    /// Σ over rows of weight × (logsumexp(logits) − logit[label]) for a micro-batch of
    /// `batch` sequences of `seq_len` rows, adapters `params` (in f64, so finite differences are
    /// not limited by f32 rounding) laid out by `lay`.
    pub fn loss(&self, lay: &LoraLayout, params: &[f64], rows: &Rows, seq_len: usize) -> f64 {
        self.loss_with_dropout(lay, params, rows, seq_len, 0.0, 0)
    }

    /// [`RefModel::loss`] with the trainer's dropout masks of probability `p` and seed `seed`.
    pub fn loss_with_dropout(
        &self,
        lay: &LoraLayout,
        params: &[f64],
        rows: &Rows,
        seq_len: usize,
        p: f32,
        seed: u32,
    ) -> f64 {
        let drop = (p, seed);
        let c = &self.model.config;
        let (d, t) = (c.n_embd, rows.ids.len());
        let eps = f64::from(c.rms_eps);
        let mut x = vec![0.0; t * d];
        for (r, &id) in rows.ids.iter().enumerate() {
            let e = &self.embd.w[id as usize * d..(id as usize + 1) * d];
            for (o, &v) in x[r * d..(r + 1) * d].iter_mut().zip(e) {
                *o = v * f64::from(c.embedding_scale);
            }
        }
        for (l, (bw, plan)) in self.blocks.iter().zip(&c.blocks).enumerate() {
            let (ap, glu) = (&plan.attn, &bw.glu);
            let mut h = x.clone();
            rmsnorm(&mut h, &bw.attn_norm, eps);
            let mut qkv = Vec::new();
            for (i, (m, tg)) in [(&bw.q, Target::Q), (&bw.k, Target::K), (&bw.v, Target::V)]
                .into_iter()
                .enumerate()
            {
                let mut y = m.apply(&h);
                if let Some(bias) = &bw.biases[i] {
                    for yr in y.chunks_exact_mut(bias.len()) {
                        yr.iter_mut().zip(bias).for_each(|(a, b)| *a += b);
                    }
                }
                self.lora(lay, params, l, tg, &h, &mut y, drop);
                qkv.push(y);
            }
            let (mut q, mut k, v) = (qkv.remove(0), qkv.remove(0), qkv.remove(0));
            if ap.qk_norm {
                rmsnorm(&mut q, &bw.q_norm, eps);
                rmsnorm(&mut k, &bw.k_norm, eps);
            }
            self.rope(&mut q, c.n_head, &ap.rope, &rows.pos);
            self.rope(&mut k, c.n_head_kv, &ap.rope, &rows.pos);
            let att = self.attention(&q, &k, &v, ap, &rows.pos, seq_len);
            let mut a = bw.o.apply(&att);
            self.lora(lay, params, l, Target::O, &att, &mut a, drop);
            if ap.post_norm {
                rmsnorm(&mut a, &bw.post_attn, eps);
            }
            x.iter_mut().zip(&a).for_each(|(xi, ai)| *xi += ai);
            let mut h = x.clone();
            rmsnorm(&mut h, &bw.ffn_norm, eps);
            let mut g = bw.gate.apply(&h);
            self.lora(lay, params, l, Target::Gate, &h, &mut g, drop);
            let mut u = bw.up.apply(&h);
            self.lora(lay, params, l, Target::Up, &h, &mut u, drop);
            let hg: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(&gi, &ui)| {
                    let a = match glu.act {
                        Activation::Silu => gi / (1.0 + (-gi).exp()),
                        Activation::GeluTanh => {
                            let k = (2.0 / std::f64::consts::PI).sqrt();
                            0.5 * gi * (1.0 + (k * (gi + 0.044715 * gi * gi * gi)).tanh())
                        }
                    };
                    a * ui
                })
                .collect();
            let mut fo = bw.down.apply(&hg);
            self.lora(lay, params, l, Target::Down, &hg, &mut fo, drop);
            if glu.post_norm {
                rmsnorm(&mut fo, &bw.post_ffw, eps);
            }
            x.iter_mut().zip(&fo).for_each(|(xi, fi)| *xi += fi);
        }
        rmsnorm(&mut x, &self.out_norm, eps);
        let logits = self.out.apply(&x);
        let mut total = 0.0;
        for (r, lr) in logits.chunks_exact(c.n_vocab).enumerate() {
            let label = rows.labels[r] as usize;
            if label >= c.n_vocab {
                continue;
            }
            let mx = lr.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = mx + lr.iter().map(|v| (v - mx).exp()).sum::<f64>().ln();
            total += f64::from(rows.weights[r]) * (lse - lr[label]);
        }
        total
    }

    /// RoPE in f64 at each row's own position.
    fn rope(&self, x: &mut [f64], heads: usize, rope: &RopePlan, pos: &[u32]) {
        let c = &self.model.config;
        let (hd, half) = (c.head_dim, c.n_rot / 2);
        // training sequences are shorter than the original context: LongRoPE's short factors
        let ff = self.model.weights.rope_factors(1, c.n_ctx_orig);
        let freqs =
            octoflow_model::ops::rope_freqs(c.n_rot, rope.base, rope.scale, ff, rope.yarn.as_ref());
        let m = f64::from(rope.yarn.map_or(1.0, |y| y.mscale));
        for (r, row) in x.chunks_exact_mut(heads * hd).enumerate() {
            for head in row.chunks_exact_mut(hd) {
                for (i, f) in freqs.iter().enumerate() {
                    let th = f64::from(pos[r]) * f;
                    let (a, b) = match rope.kind {
                        RopeType::Normal => (2 * i, 2 * i + 1),
                        RopeType::Neox => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    let (cos, sin) = (th.cos() * m, th.sin() * m);
                    head[a] = x0 * cos - x1 * sin;
                    head[b] = x0 * sin + x1 * cos;
                }
            }
        }
    }

    /// Causal attention within each sequence and document (row `i` sees rows `i - pos[i]..=i`
    /// of its sequence), GQA, sliding window.
    fn attention(
        &self,
        q: &[f64],
        k: &[f64],
        v: &[f64],
        plan: &AttnPlan,
        pos: &[u32],
        s: usize,
    ) -> Vec<f64> {
        let c = &self.model.config;
        let (hd, hdv, g) = (c.head_dim, c.head_dim_v, c.gqa_group());
        let (qd, kd, vd) = (c.q_dim(), c.k_dim(), c.v_dim());
        let t = q.len() / qd;
        let window = plan.kind.window();
        let mut out = vec![0.0; t * c.n_head * hdv];
        for r in 0..t {
            let (seq0, i) = (r / s * s, r % s);
            let first = i - (pos[r] as usize).min(i);
            for h in 0..c.n_head {
                let kh = h / g;
                let qv = &q[r * qd + h * hd..r * qd + (h + 1) * hd];
                let keys: Vec<usize> = (first..=i)
                    .filter(|&j| window.map_or(true, |w| i - j < w))
                    .collect();
                let sc: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let kr = &k[(seq0 + j) * kd + kh * hd..(seq0 + j) * kd + (kh + 1) * hd];
                        f64::from(plan.scale) * qv.iter().zip(kr).map(|(a, b)| a * b).sum::<f64>()
                    })
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
                let z: f64 = ex.iter().sum();
                let o = &mut out[r * c.n_head * hdv + h * hdv..r * c.n_head * hdv + (h + 1) * hdv];
                for (&j, e) in keys.iter().zip(&ex) {
                    let vr = &v[(seq0 + j) * vd + kh * hdv..(seq0 + j) * vd + (kh + 1) * hdv];
                    for (oi, vi) in o.iter_mut().zip(vr) {
                        *oi += e / z * vi;
                    }
                }
            }
        }
        out
    }
}
