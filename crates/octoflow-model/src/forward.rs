//! The CPU reference forward pass: one sequence, a batch of tokens at a time, f32 math.
//!
//! Per batch of `T` tokens (activations row-major, one row per token), each layer walking its
//! [`crate::plan::BlockPlan`]:
//! ```text
//! x = token_embd[tokens] * embedding_scale                     [T, n_embd]
//! for each layer:
//!     h = rmsnorm(x, attn_norm)
//!     q, k, v = h·attn_qᵀ (+ bias), h·attn_kᵀ (+ bias), h·attn_vᵀ (+ bias)
//!     q, k = rmsnorm per head (attn_q_norm, attn_k_norm)       (plan: qk_norm)
//!     q, k = rope(q), rope(k); append k, v to the KV cache      (plan: rope)
//!     a = attention(q, cache) · attn_outputᵀ                    (plan: kind, scale)
//!     a = rmsnorm(a, post_attention_norm)                        (plan: post_norm)
//!     x = x + a
//!     h = rmsnorm(x, ffn_norm)
//!     f = (act(h·ffn_gateᵀ) * h·ffn_upᵀ) · ffn_downᵀ             (plan: Glu's act)
//!     f = rmsnorm(f, post_ffw_norm)                              (plan: post_norm)
//!     x = x + f
//! logits = rmsnorm(x, output_norm) · outputᵀ                   [T or 1, n_vocab]
//! ```
//! Every intermediate can be observed through a [`Tap`] (names follow llama.cpp's graph
//! callbacks), which is how GPU kernels are compared with this reference layer by layer.

use crate::attention::{attention, attention_ggml, attention_sinks, AttentionShape};
use crate::backend::{check_batch, Forward};
use crate::config::{Activation, ModelConfig};
use crate::error::Result;
use crate::ggml_matmul::matmul_ggml;
use crate::kv_cache::KvCache;
use crate::matmul::matmul;
use crate::model::Model;
use crate::numerics::{gelu_ggml, rope_angles_ggml_yarn, round_f16_slice, Numerics};
use crate::ops::{
    add_bias_rows, add_in_place, gelu_tanh, rmsnorm_rows, rope, rope_angles_yarn, silu,
};
use crate::plan::{planned, planned_bias, qk_norms, AttnPlan, FfnPlan, GluPlan, MoePlan};
use crate::weights::{BlockWeights, FfnWeights, QMatrix};

/// Which positions of a batch get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (a prefill chunk whose predictions are not needed).
    None,
    /// The last position only: `[1, n_vocab]`.
    Last,
    /// Every position: `[n_tokens, n_vocab]`.
    All,
}

/// An intermediate activation handed to an observer during a forward pass.
#[derive(Debug, Clone, Copy)]
pub struct Tap<'a> {
    /// The layer, or `None` before the first and after the last.
    pub layer: Option<usize>,
    /// llama.cpp's name for this point of the graph: `inp_embd`, `attn_norm`, `Qcur`, `Kcur`,
    /// `Vcur` (Q and K after norms and RoPE), `kqv_out`, `attn_out`, `attn_post_norm`,
    /// `ffn_inp`, `ffn_norm`, `ffn_act`, `ffn_out`, `ffn_post_norm`, `l_out`, `result_norm`,
    /// `result_output`.
    pub name: &'static str,
    /// Rows in `data` (tokens of the batch, or output positions for `result_*`).
    pub n_rows: usize,
    /// `[n_rows, data.len() / n_rows]`, f32 row-major.
    pub data: &'a [f32],
}

/// One sequence being run through a model: the KV cache and the position reached.
pub struct Session<'m> {
    model: &'m Model,
    cache: KvCache,
    numerics: Numerics,
}

impl<'m> Session<'m> {
    /// A session with an empty KV cache of at most `n_ctx` positions, exact f32 math.
    pub fn new(model: &'m Model, n_ctx: usize) -> Self {
        Self::with_numerics(model, n_ctx, Numerics::Exact)
    }

    /// A session with an empty KV cache of at most `n_ctx` positions and the given roundings.
    pub fn with_numerics(model: &'m Model, n_ctx: usize, numerics: Numerics) -> Self {
        let c = &model.config;
        Self {
            model,
            cache: KvCache::new(c.n_layer, c.k_dim(), c.v_dim(), n_ctx),
            numerics,
        }
    }

    /// The roundings this session performs.
    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// Positions processed so far (the position of the next token).
    pub fn n_past(&self) -> usize {
        self.cache.len()
    }

    /// Forgets every position from `len` on (a no-op if fewer are cached).
    pub fn truncate(&mut self, len: usize) {
        self.cache.truncate(len);
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }

    /// Runs `tokens` at positions `start_pos..`, forgetting whatever was cached from
    /// `start_pos` on, and returns the requested logits (`[n, n_vocab]`, row-major).
    ///
    /// The whole batch goes through each matrix at once, so a long prompt reads the weights
    /// once per layer, not once per token.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        logits: Logits,
    ) -> Result<Vec<f32>> {
        self.forward_observed(tokens, start_pos, logits, &mut |_| {})
    }

    /// [`Self::forward`], handing every intermediate activation to `observe`.
    pub fn forward_observed(
        &mut self,
        tokens: &[u32],
        start_pos: usize,
        logits: Logits,
        observe: &mut dyn FnMut(Tap<'_>),
    ) -> Result<Vec<f32>> {
        self.check_batch(tokens, start_pos)?;
        self.cache.truncate(start_pos);
        let (c, w) = (&self.model.config, &self.model.weights);
        let n = tokens.len();

        let mut x = self.embed(tokens)?;
        observe(tap(None, "inp_embd", n, &x));
        for (il, plan) in c.blocks.iter().enumerate() {
            self.attention_block(il, &plan.attn, &mut x, start_pos, observe)?;
            match &plan.ffn {
                FfnPlan::Glu(g) => glu_block(c, g, &w.blk[il], il, &mut x, self.numerics, observe)?,
                FfnPlan::Moe(m) => moe_block(c, m, &w.blk[il], il, &mut x, self.numerics, observe)?,
            }
            observe(tap(Some(il), "l_out", n, &x));
        }
        self.cache.set_len(start_pos + n);

        // final norm and vocabulary projection of the requested positions
        let mut h = match logits {
            Logits::None => return Ok(Vec::new()),
            Logits::Last => x[(n - 1) * c.n_embd..].to_vec(),
            Logits::All => x,
        };
        let rows = h.len() / c.n_embd;
        rmsnorm_rows(&mut h, &w.output_norm, c.rms_eps);
        observe(tap(None, "result_norm", rows, &h));
        let out = linear(&w.output, &h, self.numerics)?;
        observe(tap(None, "result_output", rows, &out));
        Ok(out)
    }

    fn check_batch(&self, tokens: &[u32], start_pos: usize) -> Result<()> {
        let c = &self.model.config;
        check_batch(c, tokens, start_pos, self.cache.len(), self.cache.n_ctx())
    }

    /// Token embeddings, `[n_tokens, n_embd]`, times the architecture's embedding scale.
    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let (c, w) = (&self.model.config, &self.model.weights);
        let mut x = vec![0f32; tokens.len() * c.n_embd];
        for (row, &id) in x.chunks_exact_mut(c.n_embd).zip(tokens) {
            w.token_embd.dequantize_rows(id as usize, row)?;
        }
        if c.embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= c.embedding_scale);
        }
        Ok(x)
    }

    /// `x += attention(x)` for layer `il`, storing the batch's keys and values in the cache.
    fn attention_block(
        &mut self,
        il: usize,
        plan: &AttnPlan,
        x: &mut [f32],
        start_pos: usize,
        observe: &mut dyn FnMut(Tap<'_>),
    ) -> Result<()> {
        let (c, w) = (&self.model.config, &self.model.weights);
        let lw = &w.blk[il];
        let nm = self.numerics;
        let n = x.len() / c.n_embd;
        let mut t = |name, data: &[f32]| observe(tap(Some(il), name, n, data));

        let mut h = x.to_vec();
        rmsnorm_rows(&mut h, &lw.attn_norm, c.rms_eps);
        t("attn_norm", &h);

        // qkv projections for every token of the batch
        let mut q = linear_bias(&lw.attn_q, &h, lw.attn_q_bias.as_deref(), nm)?;
        let mut k = linear_bias(&lw.attn_k, &h, lw.attn_k_bias.as_deref(), nm)?;
        let mut v = linear_bias(&lw.attn_v, &h, lw.attn_v_bias.as_deref(), nm)?;
        if let Some((qn, kn)) = qk_norms(il, plan, &lw.attn_q_norm, &lw.attn_k_norm)? {
            rmsnorm_rows(&mut q, qn, c.rms_eps);
            rmsnorm_rows(&mut k, kn, c.rms_eps);
        }

        // rotary position embedding, one angle table per token shared by all heads
        let freqs = w.rope_factors(self.cache.n_ctx(), c.n_ctx_orig);
        for (i, (qt, kt)) in q
            .chunks_exact_mut(c.q_dim())
            .zip(k.chunks_exact_mut(c.k_dim()))
            .enumerate()
        {
            let angles = match nm {
                Numerics::Exact => rope_angles_yarn,
                Numerics::Ggml => rope_angles_ggml_yarn,
            }(
                start_pos + i,
                c.n_rot,
                plan.rope.base,
                plan.rope.scale,
                freqs,
                plan.rope.yarn.as_ref(),
            );
            for head in qt
                .chunks_exact_mut(c.head_dim)
                .chain(kt.chunks_exact_mut(c.head_dim))
            {
                rope(head, &angles, plan.rope.kind);
            }
        }
        t("Qcur", &q);
        t("Kcur", &k);
        t("Vcur", &v);

        // attention over the cache, which now ends with this batch (llama.cpp's cache is f16)
        if nm == Numerics::Ggml {
            round_f16_slice(&mut k);
            round_f16_slice(&mut v);
        }
        self.cache.store(il, start_pos, &k, &v);
        let end = start_pos + n;
        let mut scale = plan.scale;
        if plan.scale_q && nm == Numerics::Ggml {
            q.iter_mut().for_each(|x| *x *= scale);
            scale = 1.0;
        }
        let shape = AttentionShape {
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            head_dim_v: c.head_dim_v,
            window: plan.kind.window(),
            scale,
        };
        let mut att = vec![0f32; n * c.n_head * c.head_dim_v];
        let (keys, values) = (self.cache.keys(il, end), self.cache.values(il, end));
        match (planned(il, plan.sinks, &lw.attn_sinks, "attn_sinks")?, nm) {
            (Some(sinks), _) => {
                attention_sinks(&shape, &q, keys, values, start_pos, &mut att, nm, sinks)
            }
            (None, Numerics::Exact) => attention(&shape, &q, keys, values, start_pos, &mut att),
            (None, Numerics::Ggml) => attention_ggml(&shape, &q, keys, values, start_pos, &mut att),
        }
        t("kqv_out", &att);

        let out_bias = planned_bias(il, plan.out_bias, &lw.attn_output_bias, "attn_output")?;
        let mut o = linear_bias(&lw.attn_output, &att, out_bias.map(Vec::as_slice), nm)?;
        t("attn_out", &o);
        let post = &lw.post_attention_norm;
        if let Some(pn) = planned(il, plan.post_norm, post, "post_attention_norm")? {
            rmsnorm_rows(&mut o, pn, c.rms_eps);
            t("attn_post_norm", &o);
        }
        add_in_place(x, &o);
        t("ffn_inp", x);
        Ok(())
    }
}

impl Forward for Session<'_> {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn n_past(&self) -> usize {
        self.cache.len()
    }

    fn n_ctx(&self) -> usize {
        self.cache.n_ctx()
    }

    fn truncate(&mut self, len: usize) {
        self.cache.truncate(len);
    }

    fn forward(&mut self, tokens: &[u32], start_pos: usize, logits: Logits) -> Result<Vec<f32>> {
        Session::forward(self, tokens, start_pos, logits)
    }
}

/// `x += ffn(x)` for one layer: `down(act(gate(h)) * up(h))` with `h = rmsnorm(x)`.
fn glu_block(
    c: &ModelConfig,
    plan: &GluPlan,
    lw: &BlockWeights,
    il: usize,
    x: &mut [f32],
    nm: Numerics,
    observe: &mut dyn FnMut(Tap<'_>),
) -> Result<()> {
    let n = x.len() / c.n_embd;
    let mut t = |name, data: &[f32]| observe(tap(Some(il), name, n, data));
    let mut h = x.to_vec();
    rmsnorm_rows(&mut h, &lw.ffn_norm, c.rms_eps);
    t("ffn_norm", &h);

    let gw = lw.glu()?;
    let mut gate = linear(&gw.ffn_gate, &h, nm)?;
    let up = linear(&gw.ffn_up, &h, nm)?;
    let act = match (plan.act, nm) {
        (Activation::Silu, _) => silu,
        (Activation::GeluTanh, Numerics::Exact) => gelu_tanh,
        (Activation::GeluTanh, Numerics::Ggml) => gelu_ggml,
    };
    for (g, u) in gate.iter_mut().zip(&up) {
        *g = act(*g) * u;
    }
    t("ffn_act", &gate);

    let mut f = linear(&gw.ffn_down, &gate, nm)?;
    t("ffn_out", &f);
    if let Some(pn) = planned(il, plan.post_norm, &lw.post_ffw_norm, "post_ffw_norm")? {
        rmsnorm_rows(&mut f, pn, c.rms_eps);
        t("ffn_post_norm", &f);
    }
    add_in_place(x, &f);
    Ok(())
}

/// `x += moe(x)` for one layer: with `h = rmsnorm(x)`, the router's logits pick the
/// `n_used` largest experts per token, their weights come from the gating, and the block adds
/// `Σ weight · (down_e(act(gate_e(h), up_e(h))) + b)` in selection order.
fn moe_block(
    c: &ModelConfig,
    plan: &MoePlan,
    lw: &BlockWeights,
    il: usize,
    x: &mut [f32],
    nm: Numerics,
    observe: &mut dyn FnMut(Tap<'_>),
) -> Result<()> {
    let n = x.len() / c.n_embd;
    let mut t = |name, data: &[f32]| observe(tap(Some(il), name, n, data));
    let FfnWeights::Moe(mw) = &lw.ffn else {
        return Err(crate::error::ModelError::PlanWithoutTensor {
            name: format!("blk.{il}.ffn_gate_inp.weight"),
        });
    };
    let mut h = x.to_vec();
    rmsnorm_rows(&mut h, &lw.ffn_norm, c.rms_eps);
    t("ffn_norm", &h);
    let logits = linear_bias(&mw.router, &h, mw.router_bias.as_deref(), nm)?;
    t("ffn_moe_logits", &logits);

    let (e_n, f_n, d_n) = (plan.n_expert, plan.n_ff, c.n_embd);
    let expert =
        |m: &QMatrix, e: usize, rows: usize| m.rows(format!("{}[{e}]", m.name), e * rows, rows);
    let bias_of = |b: &Option<Vec<f32>>, e: usize, len: usize| {
        b.as_ref().map(|b| b[e * len..(e + 1) * len].to_vec())
    };
    let mut out = vec![0f32; x.len()];
    for (r, (hr, or)) in h
        .chunks_exact(d_n)
        .zip(out.chunks_exact_mut(d_n))
        .enumerate()
    {
        let lg = &logits[r * e_n..(r + 1) * e_n];
        // the largest logits, ties to the lower expert
        let mut order: Vec<usize> = (0..e_n).collect();
        order.sort_by(|&a, &b| lg[b].total_cmp(&lg[a]).then(a.cmp(&b)));
        order.truncate(plan.n_used);
        let mut weights = plan.gating.weights(lg, &order);
        if plan.weights_scale != 1.0 {
            weights.iter_mut().for_each(|w| *w *= plan.weights_scale);
        }
        for (&e, &wt) in order.iter().zip(&weights) {
            let gate = linear_bias(
                &expert(&mw.gate, e, f_n)?,
                hr,
                bias_of(&mw.gate_bias, e, f_n).as_deref(),
                nm,
            )?;
            let up = linear_bias(
                &expert(&mw.up, e, f_n)?,
                hr,
                bias_of(&mw.up_bias, e, f_n).as_deref(),
                nm,
            )?;
            let act: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(&g, &u)| plan.act.apply(g, u))
                .collect();
            let down = linear_bias(
                &expert(&mw.down, e, d_n)?,
                &act,
                bias_of(&mw.down_bias, e, d_n).as_deref(),
                nm,
            )?;
            for (o, v) in or.iter_mut().zip(&down) {
                *o += wt * v;
            }
        }
    }
    t("ffn_moe_out", &out);
    add_in_place(x, &out);
    Ok(())
}

/// `x · wᵀ`: `[n, w.n_cols]` to `[n, w.n_rows]`.
fn linear(w: &QMatrix, x: &[f32], nm: Numerics) -> Result<Vec<f32>> {
    let mut out = vec![0f32; x.len() / w.n_cols * w.n_rows];
    match nm {
        Numerics::Exact => matmul(w, x, &mut out)?,
        Numerics::Ggml => matmul_ggml(w, x, &mut out)?,
    }
    Ok(out)
}

/// `x · wᵀ + bias`.
fn linear_bias(w: &QMatrix, x: &[f32], bias: Option<&[f32]>, nm: Numerics) -> Result<Vec<f32>> {
    let mut out = linear(w, x, nm)?;
    if let Some(b) = bias {
        add_bias_rows(&mut out, b);
    }
    Ok(out)
}

fn tap<'a>(layer: Option<usize>, name: &'static str, n_rows: usize, data: &'a [f32]) -> Tap<'a> {
    Tap {
        layer,
        name,
        n_rows,
        data,
    }
}

#[cfg(test)]
#[path = "forward_tests.rs"]
mod tests;
