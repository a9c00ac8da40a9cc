//! A mixture of experts' front for a few tokens in one dispatch (shader `moe_router.comp`): the
//! block's RMSNorm, the router product and the top-k routing of [`super::MoeRoute`], where the
//! unfused path takes three dispatches with a barrier after each. The router's workgroups each
//! write their logits; the last of a token's workgroups to finish routes it (an arrival counter
//! per token, put back to zero by that workgroup).

use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Push};

use super::route::{moe_route_ref, MAX_EXPERTS, MAX_USED};
use super::MoeGating;
use crate::elementwise::rms_norm::rms_norm_ref;
use crate::error::Result;
use crate::linear::linear_ref;
use crate::linear::q8_words;
use crate::linear::qweight::{row_bytes, type_index, word_slice, QOp, TYPES};
use crate::operand::{bad, need};
use crate::scratch::QueueScratch;
use crate::spec::SpecPipelines;

const OP: &str = "moe_router";
/// Steps of at most this many tokens take a workgroup per (token, 2 router rows): more, shorter
/// workgroups for the latency of decode steps (one stream's, and batched streams' as measured).
/// Larger ones (prompts) take tiles of up to 8 rows and 8 tokens, each router row read once
/// per 8 tokens instead of once per token.
const FEW_TOKENS: u32 = 64;
const WG: u32 = 256;
/// The most tokens one dispatch takes: a workgroup row each, up to the grid height every
/// Vulkan device allows (`maxComputeWorkGroupCount[1]` is at least 65,535).
pub const ROUTER_MAX_TOKENS: u32 = 65_535;
const PUSH_BYTES: u32 = 36;

/// One fused routing of `n_tokens` tokens (see the module doc).
pub struct RouterArgs<'a> {
    /// `[n_tokens, n_cols]` f32: the residual stream.
    pub x: &'a BufferSlice,
    /// `[n_cols]` f32: the norm's weight.
    pub norm: &'a BufferSlice,
    pub eps: f32,
    /// The router: `n_expert` rows of `n_cols` elements of `ty`.
    pub ty: GgmlType,
    pub w: &'a BufferSlice,
    /// `[n_expert]` f32.
    pub bias: Option<&'a BufferSlice>,
    pub n_expert: u32,
    pub n_cols: u32,
    pub n_tokens: u32,
    pub n_used: u32,
    pub gating: MoeGating,
    pub scale: f32,
    /// Outputs: the normed stream `[n_tokens, n_cols]`, the logits `[n_tokens, n_expert]`, and
    /// per (token, slot) pair the expert `ids` (u32) and `weights` (f32), `[n_tokens, n_used]`.
    pub h: &'a BufferSlice,
    pub logits: &'a BufferSlice,
    pub ids: &'a BufferSlice,
    pub weights: &'a BufferSlice,
    /// Optional output: h quantized per block of 32 in `quantize_q8.comp`'s layout
    /// ([`crate::q8_words`]`(n_tokens, n_cols)` words; n_cols a multiple of 32), for the
    /// experts' 8-bit dot products ([`crate::ExpertsArgs::xq`]).
    pub xq: Option<&'a BufferSlice>,
}

/// The fused routing kernel, a pipeline per router type, built on first use.
pub struct MoeRouter {
    pipelines: Vec<SpecPipelines>,
    counts: QueueScratch,
}

impl Default for MoeRouter {
    fn default() -> Self {
        Self::new()
    }
}

impl MoeRouter {
    pub fn new() -> Self {
        MoeRouter {
            pipelines: (0..TYPES.len())
                .map(|i| {
                    let s = QOp::MoeRouter.variant(i);
                    SpecPipelines::new(s, 10, PUSH_BYTES, s.name)
                })
                .collect(),
            counts: QueueScratch::zeroed("moe_router_count"),
        }
    }

    /// Records `a`: one dispatch. Checks the type, the limits and every operand's size.
    pub fn record(&self, chain: &mut Chain, a: &RouterArgs) -> Result<()> {
        let ti = type_index(OP, a.ty)?;
        let rb = row_bytes(OP, a.ty, a.n_cols)?;
        if a.n_tokens == 0 || a.n_tokens > ROUTER_MAX_TOKENS {
            return Err(bad(
                OP,
                format!(
                    "{} tokens: the fused router takes 1..={ROUTER_MAX_TOKENS}",
                    a.n_tokens
                ),
            ));
        }
        if a.n_used == 0 || a.n_used > a.n_expert || a.n_expert > MAX_EXPERTS || a.n_used > MAX_USED
        {
            return Err(bad(
                OP,
                format!(
                    "{} of {} experts: the kernel takes 1..=min(n_expert, {MAX_USED}) of at most {MAX_EXPERTS}",
                    a.n_used, a.n_expert
                ),
            ));
        }
        let (n, cols) = (u128::from(a.n_tokens), u128::from(a.n_cols));
        let w = word_slice(OP, "router", a.w, u64::from(a.n_expert) * u64::from(rb))?;
        need(OP, "x", a.x, n * cols)?;
        need(OP, "norm", a.norm, cols)?;
        need(OP, "h", a.h, n * cols)?;
        need(OP, "logits", a.logits, n * u128::from(a.n_expert))?;
        need(OP, "ids", a.ids, n * u128::from(a.n_used))?;
        need(OP, "weights", a.weights, n * u128::from(a.n_used))?;
        if let Some(b) = a.bias {
            need(OP, "bias", b, u128::from(a.n_expert))?;
        }
        if let Some(xq) = a.xq {
            if !a.n_cols.is_multiple_of(32) {
                return Err(bad(
                    OP,
                    format!("h of {} columns: q8(h) takes whole blocks of 32", a.n_cols),
                ));
            }
            need(OP, "xq", xq, u128::from(q8_words(a.n_tokens, a.n_cols)))?;
        }
        let counts = self.counts.get_slice(chain, 4 * u64::from(a.n_tokens))?;
        let push = Push::new()
            .u32(a.n_expert)
            .u32(a.n_cols)
            .u32(rb)
            .u32(a.n_used)
            .u32(a.gating.code())
            .f32(a.scale)
            .f32(a.eps)
            .u32(u32::from(a.bias.is_some()) | (u32::from(a.xq.is_some()) << 1))
            .u32(a.n_tokens);
        let ctx = chain.context();
        let (rows, tt) = tile(a.n_tokens, ctx.caps().subgroup.max_size);
        let pipeline = self.pipelines[ti].get(ctx, [rows, tt, 0, 0, 0, 0, 0])?;
        chain.dispatch(
            &pipeline,
            &[
                w,
                a.x.clone(),
                a.norm.clone(),
                a.bias.unwrap_or(a.norm).clone(), // absent: never read
                a.h.clone(),
                a.logits.clone(),
                a.ids.clone(),
                a.weights.clone(),
                counts,
                a.xq.unwrap_or(a.h).clone(), // absent: never written
            ],
            &push,
            [a.n_expert.div_ceil(rows), a.n_tokens.div_ceil(tt), 1],
        )?;
        Ok(())
    }
}

/// (router rows, tokens) a workgroup takes for a step of `n_tokens`: (2, 1) up to
/// [`FEW_TOKENS`], else (8, 8) — fewer rows where a subgroup of `max_subgroup` would straddle two rows' lanes.
fn tile(n_tokens: u32, max_subgroup: u32) -> (u32, u32) {
    if n_tokens <= FEW_TOKENS {
        (2, 1)
    } else {
        ((WG / max_subgroup.max(1)).clamp(1, 8), 8)
    }
}

/// What [`moe_router_ref`] computes: [`RouterArgs`]' outputs.
pub struct RouterRef {
    pub h: Vec<f32>,
    pub logits: Vec<f32>,
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
}

/// CPU reference of [`MoeRouter::record`]: [`rms_norm_ref`], [`linear_ref`] (the router on h,
/// dotted in f64) and [`moe_route_ref`].
#[allow(clippy::too_many_arguments)]
pub fn moe_router_ref(
    ty: GgmlType,
    w: &[u8],
    bias: Option<&[f32]>,
    n_expert: usize,
    n_cols: usize,
    x: &[f32],
    norm: &[f32],
    eps: f32,
    n_used: usize,
    gating: MoeGating,
    scale: f32,
) -> std::result::Result<RouterRef, octoflow_gguf::quant::QuantError> {
    let n = x.len() / n_cols;
    let mut h = vec![0f32; x.len()];
    rms_norm_ref(x, norm, &mut h, n_cols, eps);
    let mut logits = vec![0f32; n * n_expert];
    linear_ref(
        ty,
        w,
        n_expert,
        n_cols,
        &h,
        n,
        &mut logits,
        n_expert,
        0,
        bias,
        false,
    )?;
    let (ids, weights) = moe_route_ref(&logits, n_expert, n_used, gating, scale);
    Ok(RouterRef {
        h,
        logits,
        ids,
        weights,
    })
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{buffer_with, poisoned, random, random_weights, read, seeded, with};

    /// The norm as rms_norm.comp computes it (f32 sums in another order): 1e-5. The logits are
    /// f32 sums of up to ~1,000 products against an f64 reference (the linear products'
    /// bound), and the weights follow them through exp: 1e-3.
    const REL_H: f32 = 1e-5;
    const REL: f32 = 1e-3;

    /// Whether token `lg`'s n_used + 1 largest logits are apart by more than `gap` each (else
    /// f32 rounding may order them otherwise than the f64 reference).
    fn separated(lg: &[f32], n_used: usize, gap: f32) -> bool {
        let mut s = lg.to_vec();
        s.sort_by(|a, b| b.total_cmp(a));
        s.windows(2).take(n_used).all(|w| w[0] - w[1] > gap)
    }

    #[test]
    fn gpu_fused_routing_matches_the_reference_for_every_type() {
        let Some(ctx) = gpu_or_skip("gpu_moe_router") else {
            return;
        };
        let (seed, mut rng) = seeded(module_path!());
        let k = MoeRouter::new();
        let gatings = [
            MoeGating::SoftmaxOfSelected,
            MoeGating::Softmax { norm: false },
            MoeGating::Softmax { norm: true },
        ];
        let (mut checked, mut tokens) = (0, 0);
        for (i, &ty) in TYPES.iter().enumerate() {
            let (n_expert, n_used) = [(4usize, 2usize), (32, 4), (129, 8)][i % 3];
            let n_cols = match ty.block_size() {
                1 => rng.gen_range(1..300),
                bs => bs * rng.gen_range(1..=(512 / bs).max(1)),
            };
            // a few tokens (decode), or a batch's many
            let n = if i % 4 == 3 {
                rng.gen_range(65..=80usize)
            } else {
                rng.gen_range(1..=4usize)
            };
            let gating = gatings[i % 3];
            let biased = i % 2 == 0;
            let w = random_weights(&mut rng, ty, n_expert, n_cols);
            let x = random(&mut rng, n * n_cols);
            let norm: Vec<f32> = (0..n_cols).map(|_| rng.gen_range(0.5..1.5)).collect();
            let bias = random(&mut rng, n_expert);
            let (eps, scale) = (1e-5, rng.gen_range(0.5..2.0));
            let (wb, xb, nb, bb) = (
                buffer_with(&ctx, "router", &w),
                with(&ctx, "x", &x),
                with(&ctx, "norm", &norm),
                with(&ctx, "bias", &bias),
            );
            let hb = poisoned(&ctx, "h", n * n_cols);
            // q8(h) too, where its blocks are whole
            let quantized = n_cols % 32 == 0 && i % 3 != 1;
            let xqb = poisoned(&ctx, "xq", q8_words(n as u32, n_cols as u32) as usize);
            let xqd = xqb.whole();
            let lb = poisoned(&ctx, "logits", n * n_expert);
            let ib = poisoned(&ctx, "ids", n * n_used);
            let wtb = poisoned(&ctx, "weights", n * n_used);
            let (wd, xd, nd, bd) = (wb.whole(), xb.whole(), nb.whole(), bb.whole());
            let (hd, ld, id, wtd) = (hb.whole(), lb.whole(), ib.whole(), wtb.whole());
            let args = RouterArgs {
                x: &xd,
                norm: &nd,
                eps,
                ty,
                w: &wd,
                bias: biased.then_some(&bd),
                n_expert: n_expert as u32,
                n_cols: n_cols as u32,
                n_tokens: n as u32,
                n_used: n_used as u32,
                gating,
                scale,
                h: &hd,
                logits: &ld,
                ids: &id,
                weights: &wtd,
                xq: quantized.then_some(&xqd),
            };
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(&mut chain, &args).unwrap();
            let RouterRef {
                h,
                logits,
                ids,
                weights: wts,
            } = moe_router_ref(
                ty,
                &w,
                biased.then_some(&bias),
                n_expert,
                n_cols,
                &x,
                &norm,
                eps,
                n_used,
                gating,
                scale,
            )
            .unwrap();
            let what = format!("{ty}: {n} tokens, {n_used} of {n_expert}, {n_cols} columns, {gating:?}, bias {biased}, q8(h) {quantized}, seed {seed}");
            // twice: the first run's last workgroups must have put the counters back
            for run in 0..2 {
                for b in [&hb, &lb, &ib, &wtb, &xqb] {
                    ctx.fill(b, 0, b.size(), f32::NAN.to_bits()).unwrap();
                }
                chain.run().unwrap();
                let got_h = read(&ctx, &hb, h.len());
                if let Err(e) = check_close(&got_h, &h, REL_H) {
                    panic!("h, run {run}: {what}: {e}");
                }
                if quantized {
                    let mut words = vec![0u32; q8_words(n as u32, n_cols as u32) as usize];
                    ctx.download(&xqb, 0, &mut words).unwrap();
                    if let Err(e) = crate::testkit::check_q8_layout(&words, &got_h, n_cols) {
                        panic!("q8(h), run {run}: {what}: {e}");
                    }
                }
                let got_l = read(&ctx, &lb, logits.len());
                if let Err(e) = check_close(&got_l, &logits, REL) {
                    panic!("logits, run {run}: {what}: {e}");
                }
                let mut got_ids = vec![0u32; ids.len()];
                ctx.download(&ib, 0, &mut got_ids).unwrap();
                let got_w = read(&ctx, &wtb, wts.len());
                let top = logits.iter().fold(0f32, |m, v| m.max(v.abs()));
                for t in 0..n {
                    let s = t * n_used..(t + 1) * n_used;
                    tokens += 1;
                    if !separated(
                        &logits[t * n_expert..(t + 1) * n_expert],
                        n_used,
                        1e-3 * top,
                    ) {
                        continue;
                    }
                    checked += 1;
                    assert_eq!(
                        got_ids[s.clone()],
                        ids[s.clone()],
                        "ids of token {t}, run {run}: {what}"
                    );
                    if let Err(e) = check_close(&got_w[s.clone()], &wts[s], REL) {
                        panic!("weights of token {t}, run {run}: {what}: {e}");
                    }
                }
            }
        }
        assert!(
            checked * 2 >= tokens,
            "only {checked} of {tokens} tokens had separated logits"
        );
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn fused_routing_limits_are_clear_errors() {
        let Some(ctx) = gpu_or_skip("moe_router_bad") else {
            return;
        };
        let b = poisoned(&ctx, "b", 1 << 12);
        let bw = b.whole();
        let k = MoeRouter::new();
        let args = |n_tokens, n_used| RouterArgs {
            x: &bw,
            norm: &bw,
            eps: 1e-5,
            ty: GgmlType::F32,
            w: &bw,
            bias: None,
            n_expert: 4,
            n_cols: 32,
            n_tokens,
            n_used,
            gating: MoeGating::SoftmaxOfSelected,
            scale: 1.0,
            h: &bw,
            logits: &bw,
            ids: &bw,
            weights: &bw,
            xq: None,
        };
        let err = |a: &RouterArgs| {
            k.record(&mut Chain::new(&ctx).unwrap(), a)
                .unwrap_err()
                .to_string()
        };
        let e = err(&args(ROUTER_MAX_TOKENS + 1, 2));
        assert!(e.contains("65536 tokens") && e.contains("1..=65535"), "{e}");
        let e = err(&args(0, 2));
        assert!(e.contains("0 tokens"), "{e}");
        let e = err(&args(1, 5));
        assert!(e.contains("5 of 4 experts"), "{e}");
        k.record(&mut Chain::new(&ctx).unwrap(), &args(2, 2))
            .unwrap();
    }
}
