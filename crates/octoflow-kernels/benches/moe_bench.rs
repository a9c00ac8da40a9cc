//! Timing of a mixture of experts' one-token step (ignored tests, not correctness tests): a
//! module of the expert kernels' device tests, compiled only with the `bench` feature. Run on
//! the device with `cargo test -p octoflow-kernels --release --features bench --lib
//! moe_decode_timing -- --ignored --nocapture --test-threads=1`.
//!
//! For each model shape it records the feed-forward of `LAYERS` layers (cycling through
//! `SETS` sets of random weights, so that no layer finds its experts in the L2 cache of the
//! one before) both ways: unfused (norm, router, routing, gate/up, down, combine: six barrier
//! phases) and fused (`moe_router`, gate/up, down with COMBINE: three). It prints the host wall
//! time of a replay per layer, and the GPU time per kernel of a profiled replay against the
//! time to read the routed experts' weights at 3 TB/s.

use std::time::Instant;

use octoflow_gguf::GgmlType;
use octoflow_vk::testing::gpu_or_skip;
use octoflow_vk::{Buffer, Chain, Context};
use rand::{Rng, SeedableRng};

use super::super::*;
use crate::elementwise::rms_norm::RmsNorm;
use crate::linear::Linear;
use crate::shaders;
use crate::testkit::{poisoned, random, with};
use crate::{LinearArgs, QWeightRef};

const LAYERS: usize = 24;
const SETS: usize = 4;

/// (label, n_embd, n_ff, experts, used, expert type)
type Shape = (&'static str, u32, u32, u32, u32, GgmlType);

/// One layer's weights: the router (F32), its bias, gate, up and down.
struct LayerWeights {
    router: Buffer,
    bias: Buffer,
    norm: Buffer,
    gate: Buffer,
    up: Buffer,
    down: Buffer,
}

/// Random bytes in `ty`'s encoding whose scales keep values finite: every block's first byte
/// (MXFP4's exponent) or first f16 (the other types' d) set to a moderate value.
fn weight_bytes(rng: &mut impl Rng, ty: GgmlType, n_rows: usize, n_cols: usize) -> Vec<u8> {
    let size = octoflow_gguf::quant::quantized_size(ty, n_rows * n_cols).unwrap();
    let mut b = vec![0u8; size];
    rng.fill(&mut b[..]);
    for blk in b.chunks_exact_mut(ty.type_size()) {
        if ty == GgmlType::MXFP4 {
            blk[0] = 120;
        } else {
            blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
        }
    }
    b
}

/// Host wall time (µs) of one replay of `chain`: the mean of 20 after two warm-ups.
fn wall_us(chain: &mut Chain) -> f64 {
    chain.run().unwrap();
    chain.run().unwrap();
    let t = Instant::now();
    for _ in 0..20 {
        chain.run().unwrap();
    }
    t.elapsed().as_secs_f64() * 1e6 / 20.0
}

#[test]
#[ignore]
fn moe_decode_timing() {
    let Some(ctx) = gpu_or_skip("moe_decode_timing") else {
        return;
    };
    let shapes: [Shape; 2] = [
        ("gpt-oss-20b", 2880, 2880, 32, 4, GgmlType::MXFP4),
        ("qwen3moe-30b-a3b", 2048, 768, 128, 8, GgmlType::Q4_K),
    ];
    for (label, n_embd, n_ff, n_expert, n_used, ty) in shapes {
        run_shape(&ctx, label, n_embd, n_ff, n_expert, n_used, ty);
    }
}

fn run_shape(
    ctx: &Context,
    label: &str,
    n_embd: u32,
    n_ff: u32,
    n_expert: u32,
    n_used: u32,
    ty: GgmlType,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (e, d, f) = (n_expert as usize, n_embd as usize, n_ff as usize);
    let expert_bytes = |rows: usize, cols: usize| {
        octoflow_gguf::quant::quantized_size(ty, rows * cols).unwrap() as u64
    };
    let whole = expert_bytes(e * f, d).max(expert_bytes(e * d, f));
    if whole > ctx.caps().max_buffer_bytes() {
        println!("{label}: an expert tensor of {whole} bytes is over this device's binding limit; skipped");
        return;
    }
    let sets: Vec<LayerWeights> = (0..SETS)
        .map(|_| LayerWeights {
            router: with(ctx, "router", &random(&mut rng, e * d)),
            bias: with(ctx, "router_bias", &random(&mut rng, e)),
            norm: with(ctx, "norm", &random(&mut rng, d)),
            gate: crate::testkit::buffer_with(ctx, "gate", &weight_bytes(&mut rng, ty, e * f, d)),
            up: crate::testkit::buffer_with(ctx, "up", &weight_bytes(&mut rng, ty, e * f, d)),
            down: crate::testkit::buffer_with(ctx, "down", &weight_bytes(&mut rng, ty, e * d, f)),
        })
        .collect();
    let pairs = n_used as usize;
    let x = with(ctx, "x", &random(&mut rng, d));
    let h = poisoned(ctx, "h", d);
    let logits = poisoned(ctx, "logits", e);
    let ids = poisoned(ctx, "ids", pairs);
    let wts = poisoned(ctx, "weights", pairs);
    let act = poisoned(ctx, "act", pairs * f);
    let y = poisoned(ctx, "y", pairs * d);
    let xq = poisoned(ctx, "xq", crate::q8_words(1, n_embd) as usize);
    let xqw = xq.whole();
    let lin = Linear::new(ctx).unwrap();
    let norm = RmsNorm::new(ctx).unwrap();
    let moe = Moe::new(ctx).unwrap();
    let swiglu = MoeAct::SwigluOai {
        alpha: 1.702,
        limit: 7.0,
    };
    let record = |chain: &mut Chain, fused: bool, ex: &MoeExperts| {
        let (xw, hw, lw, iw, ww, aw, yw) = (
            x.whole(),
            h.whole(),
            logits.whole(),
            ids.whole(),
            wts.whole(),
            act.whole(),
            y.whole(),
        );
        for l in 0..LAYERS {
            let s = &sets[l % SETS];
            let (rw, bw, nw) = (s.router.whole(), s.bias.whole(), s.norm.whole());
            if fused {
                moe.router
                    .record(
                        chain,
                        &RouterArgs {
                            x: &xw,
                            norm: &nw,
                            eps: 1e-5,
                            ty: GgmlType::F32,
                            w: &rw,
                            bias: Some(&bw),
                            n_expert,
                            n_cols: n_embd,
                            n_tokens: 1,
                            n_used,
                            gating: MoeGating::SoftmaxOfSelected,
                            scale: 1.0,
                            h: &hw,
                            logits: &lw,
                            ids: &iw,
                            weights: &ww,
                            xq: ex.takes_quantized(ty, n_embd).then_some(&xqw),
                        },
                    )
                    .unwrap();
            } else {
                norm.record(chain, &xw, &nw, &hw, 1, n_embd, 1e-5).unwrap();
                chain.compute_barrier().unwrap();
                lin.record_f32(
                    chain,
                    &LinearArgs {
                        w: QWeightRef {
                            ty: GgmlType::F32,
                            data: &rw,
                            n_rows: n_expert,
                            n_cols: n_embd,
                        },
                        x: &hw,
                        y: &lw,
                        n_tokens: 1,
                        y_stride: n_expert,
                        y_col: 0,
                        bias: Some(&bw),
                        accumulate: false,
                        norm: None,
                        pending: None,
                    },
                )
                .unwrap();
                chain.compute_barrier().unwrap();
                moe.route
                    .record(
                        chain,
                        &lw,
                        &iw,
                        &ww,
                        1,
                        n_expert,
                        n_used,
                        MoeGating::SoftmaxOfSelected,
                        1.0,
                    )
                    .unwrap();
            }
            chain.compute_barrier().unwrap();
            let (gw, uw, dw) = (s.gate.whole(), s.up.whole(), s.down.whole());
            let ew = |data, rows, cols| ExpertWeights {
                ty,
                data,
                e_begin: 0,
                n_experts: n_expert,
                n_rows: rows,
                n_cols: cols,
            };
            ex.record(
                chain,
                &ExpertsArgs {
                    xq: (fused && ex.takes_quantized(ty, n_embd)).then_some(&xqw),
                    w: ew(&gw, n_ff, n_embd),
                    glu: Some((ew(&uw, n_ff, n_embd), swiglu)),
                    bias: None,
                    bias_up: None,
                    n_expert,
                    x: &hw,
                    x_div: n_used,
                    y: &aw,
                    ids: &iw,
                    n_pairs: n_used,
                    groups: None,
                    combine: None,
                },
            )
            .unwrap();
            chain.compute_barrier().unwrap();
            ex.record(
                chain,
                &ExpertsArgs {
                    xq: None,
                    w: ew(&dw, n_embd, n_ff),
                    glu: None,
                    bias: None,
                    bias_up: None,
                    n_expert,
                    x: &aw,
                    x_div: 1,
                    y: &yw,
                    ids: &iw,
                    n_pairs: n_used,
                    groups: None,
                    combine: fused.then_some(Combine {
                        weights: &ww,
                        x: &xw,
                        n_used,
                    }),
                },
            )
            .unwrap();
            chain.compute_barrier().unwrap();
            if !fused {
                moe.combine
                    .record(chain, &yw, &ww, &xw, 1, n_used, n_embd)
                    .unwrap();
                chain.compute_barrier().unwrap();
            }
        }
    };
    // the routed experts' bytes a layer: gate, up and down of n_used experts
    let per_layer = n_used as f64 * (2.0 * expert_bytes(f, d) as f64 + expert_bytes(d, f) as f64)
        + (e * d * 4) as f64;
    let floor_us = per_layer / 3.0e12 * 1e6;
    println!(
        "{label} ({ty}, {n_used} of {n_expert} experts, {n_embd} x {n_ff}): {:.2} MB a layer, floor {floor_us:.2} us at 3 TB/s",
        per_layer / 1e6
    );
    // the fused layer again with the 8-bit dot kernels' ablation that neither reads nor
    // quantizes x (wrong results): what their input costs
    let noq = (ty == GgmlType::MXFP4)
        .then(|| {
            Moe::new(ctx)
                .unwrap()
                .experts
                .with_xq(false)
                .with_dot_variant(ty, true, shaders::MOE_DOT_GLU_X_NOQ_MXFP4)?
                .with_dot_variant(ty, false, shaders::MOE_DOT_COMBINE_X_NOQ_MXFP4)
        })
        .flatten();
    let plain = Moe::new(ctx).unwrap().experts.with_xq(false);
    let xq_on = Moe::new(ctx).unwrap().experts.with_xq(true);
    let mut ways = vec![
        ("unfused", false, &plain),
        ("fused", true, &plain),
        (
            "fused, the GLU's input quantized by the router",
            true,
            &xq_on,
        ),
    ];
    if let Some(ex) = noq.as_ref() {
        ways.push(("fused, x not quantized (ablation)", true, ex));
    }
    for (way, fused, ex) in ways {
        let mut chain = Chain::new(ctx).unwrap();
        record(&mut chain, fused, ex);
        let wall = wall_us(&mut chain) / LAYERS as f64;
        let mut prof = Chain::with_profiling(ctx).unwrap();
        record(&mut prof, fused, ex);
        prof.run().unwrap();
        prof.run().unwrap();
        let t = prof.timings().unwrap().unwrap();
        let mut per: Vec<(String, f64, usize)> = Vec::new();
        for dsp in &t {
            match per.iter_mut().find(|(n, ..)| *n == dsp.label) {
                Some(p) => {
                    p.1 += dsp.ns;
                    p.2 += 1;
                }
                None => per.push((dsp.label.to_string(), dsp.ns, 1)),
            }
        }
        println!("  {way}: {wall:.2} us a layer (host wall time of a replay of {LAYERS} layers)");
        for (name, ns, count) in per {
            println!(
                "    {name:<28} {:>8.2} us a layer ({} dispatches)",
                ns * 1e-3 / LAYERS as f64,
                count / LAYERS
            );
        }
    }
}

/// Host wall time (µs) per recorded unit of `rec` replayed `n` times in one chain (a compute
/// barrier after each, and a cache flush before each where `flush` is given): the best of 10
/// runs after ~150 ms of work (clocks up).
fn unit_us(ctx: &Context, n: usize, flush: Option<&Buffer>, rec: &dyn Fn(&mut Chain)) -> f64 {
    let mut chain = Chain::new(ctx).unwrap();
    for _ in 0..n {
        if let Some(f) = flush {
            chain.fill(&f.whole(), 0x3f80_0000).unwrap();
            chain.barrier().unwrap();
        }
        rec(&mut chain);
        chain.compute_barrier().unwrap();
    }
    chain.run().unwrap();
    let t0 = Instant::now();
    while t0.elapsed().as_secs_f64() < 0.15 {
        chain.run().unwrap();
    }
    let mut best = f64::MAX;
    for _ in 0..10 {
        let t = Instant::now();
        chain.run().unwrap();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best * 1e6 / n as f64
}

/// Timing, not a correctness test: gpt-oss-20b's one-token router (`moe_router`: norm, 32 ×
/// 2,880 f32 product, top-4) against an RMSNorm of the same row, each a dispatch and a compute
/// barrier, back to back (weights in L2) and after a flush of the L2 (a fill and a full barrier,
/// whose own cost `flush only` shows): `cargo test -p octoflow-kernels --release --features
/// bench --lib moe_router_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn moe_router_timing() {
    let Some(ctx) = gpu_or_skip("moe_router_timing") else {
        return;
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let (e, d, used) = (32u32, 2880u32, 4u32);
    let router = with(&ctx, "router", &random(&mut rng, (e * d) as usize));
    let bias = with(&ctx, "bias", &random(&mut rng, e as usize));
    let g = with(&ctx, "norm", &random(&mut rng, d as usize));
    let x = with(&ctx, "x", &random(&mut rng, d as usize));
    let h = poisoned(&ctx, "h", d as usize);
    let logits = poisoned(&ctx, "logits", e as usize);
    let ids = poisoned(&ctx, "ids", used as usize);
    let wts = poisoned(&ctx, "weights", used as usize);
    let flush = Buffer::new(
        &ctx,
        "flush",
        128 << 20,
        octoflow_vk::MemoryKind::DeviceLocal,
    )
    .unwrap();
    let moe = Moe::new(&ctx).unwrap();
    let norm = RmsNorm::new(&ctx).unwrap();
    let (rw, bw, gw, xw, hw, lw, iw, ww) = (
        router.whole(),
        bias.whole(),
        g.whole(),
        x.whole(),
        h.whole(),
        logits.whole(),
        ids.whole(),
        wts.whole(),
    );
    let one = RouterArgs {
        x: &xw,
        norm: &gw,
        eps: 1e-5,
        ty: GgmlType::F32,
        w: &rw,
        bias: Some(&bw),
        n_expert: e,
        n_cols: d,
        n_tokens: 1,
        n_used: used,
        gating: MoeGating::SoftmaxOfSelected,
        scale: 1.0,
        h: &hw,
        logits: &lw,
        ids: &iw,
        weights: &ww,
        xq: None,
    };
    let route = |chain: &mut Chain| moe.router.record(chain, &one).unwrap();
    let rms = |chain: &mut Chain| norm.record(chain, &xw, &gw, &hw, 1, d, 1e-5).unwrap();
    let nothing = |_: &mut Chain| {};
    let n = 240;
    println!("gpt-oss-20b router (32 x 2880 f32, top-4), us a dispatch with its barrier:");
    for (name, rec) in [
        ("moe_router", &route as &dyn Fn(&mut Chain)),
        ("rms_norm", &rms),
        ("flush only", &nothing),
    ] {
        let hot = unit_us(&ctx, n, None, rec);
        let cold = unit_us(&ctx, n / 4, Some(&flush), rec);
        println!("  {name:<12} hot {hot:7.2}  after a flush {cold:7.2}");
    }
    // a prompt's router (512 tokens: tiles of 8 rows x 8 tokens), GPU time
    let t = 512u32;
    let xp = with(&ctx, "x", &random(&mut rng, (t * d) as usize));
    let hp = poisoned(&ctx, "h", (t * d) as usize);
    let lp = poisoned(&ctx, "logits", (t * e) as usize);
    let ip = poisoned(&ctx, "ids", (t * used) as usize);
    let wp = poisoned(&ctx, "weights", (t * used) as usize);
    let (xs, hs, ls, is, ws) = (xp.whole(), hp.whole(), lp.whole(), ip.whole(), wp.whole());
    let args = RouterArgs {
        x: &xs,
        n_tokens: t,
        h: &hs,
        logits: &ls,
        ids: &is,
        weights: &ws,
        ..one
    };
    let router = MoeRouter::new();
    let ns = crate::linear_bench::gpu_ns(&ctx, 11, &|c| router.record(c, &args).unwrap());
    println!("  512 tokens           {:8.2} us", ns / 1e3);
}

/// gpt-oss-20b's grouped expert products of a prompt (32 MXFP4 experts of 2,880 x 2,880, four
/// a token, random routing) on cooperative matrices, 8 to 512 tokens: the grouping, the GLU
/// (gate, up, biases, the clamped SwiGLU) and the down product in tiles of 64 pairs, of 128
/// (`MoeExperts::with_coop_wide`) and of 16 (`MoeExperts::with_coop_narrow`), GPU time, outputs
/// compared (`cargo test -p octoflow-kernels
/// --release --features bench --lib moe_prefill_timing -- --ignored --nocapture`).
#[test]
#[ignore]
fn moe_prefill_timing() {
    use crate::moe::{Groups, MoeAct};
    let Some(ctx) = gpu_or_skip("moe_prefill_timing") else {
        return;
    };
    let gpu_ns = crate::linear_bench::gpu_ns;
    let ty = GgmlType::MXFP4;
    let (n_expert, n_used, n_rows, n_cols) = (32u32, 4u32, 2880u32, 2880u32);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let stacked = (n_expert * n_rows) as usize;
    let (gate, up, down) = (
        with(
            &ctx,
            "gate",
            &weight_bytes(&mut rng, ty, stacked, n_cols as usize),
        ),
        with(
            &ctx,
            "up",
            &weight_bytes(&mut rng, ty, stacked, n_cols as usize),
        ),
        with(
            &ctx,
            "down",
            &weight_bytes(&mut rng, ty, stacked, n_cols as usize),
        ),
    );
    let bias = with(&ctx, "bias", &random(&mut rng, stacked));
    let base = MoeExperts::new().with_coop(true);
    let wide = MoeExperts::new().with_coop(true).with_coop_wide(0);
    let narrow = MoeExperts::new().with_coop(true).with_coop_narrow(u32::MAX);
    if !base.uses_coop(ctx.caps()) {
        println!("moe_prefill_timing: no cooperative matrices on this device");
        return;
    }
    let group = MoeGroup::new(&ctx).unwrap();
    // several streams' decode steps, then prompts
    for n_tokens in [8u32, 32, 64, 128, 512] {
        let n_pairs = n_tokens * n_used;
        let mut ids = Vec::with_capacity(n_pairs as usize);
        for _ in 0..n_tokens {
            let mut chosen: Vec<u32> = Vec::new();
            while chosen.len() < n_used as usize {
                let e = rng.gen_range(0..n_expert);
                if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
            ids.extend(chosen);
        }
        let (offsets, list) = moe_group_ref(&ids, n_expert as usize);
        let max_group = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let ib = with(&ctx, "ids", &ids);
        let (ob, lb) = (with(&ctx, "offsets", &offsets), with(&ctx, "list", &list));
        let xb = with(&ctx, "x", &random(&mut rng, (n_tokens * n_cols) as usize));
        let hb = with(&ctx, "h", &random(&mut rng, (n_pairs * n_cols) as usize));
        let outputs = (n_pairs * n_rows) as usize;
        let yb = poisoned(&ctx, "y", outputs);
        let (ids_s, off_s, list_s) = (ib.whole(), ob.whole(), lb.whole());
        let grouping = gpu_ns(&ctx, 11, &|c| {
            group
                .record(c, &ids_s, &off_s, &list_s, n_pairs, n_expert)
                .unwrap()
        });
        println!(
            "x{n_tokens}: grouping {n_pairs} pairs {:.1} us, groups of up to {max_group} pairs",
            grouping / 1e3
        );
        let (gs, us, ds, bs) = (gate.whole(), up.whole(), down.whole(), bias.whole());
        let (xs, hs, ys) = (xb.whole(), hb.whole(), yb.whole());
        let ew = |data| ExpertWeights {
            ty,
            data,
            e_begin: 0,
            n_experts: n_expert,
            n_rows,
            n_cols,
        };
        let groups = Groups {
            offsets: &off_s,
            list: &list_s,
            max_group,
        };
        let act = MoeAct::SwigluOai {
            alpha: 1.702,
            limit: 7.0,
        };
        let args = |glu: bool| ExpertsArgs {
            w: ew(if glu { &gs } else { &ds }),
            glu: glu.then_some((ew(&us), act)),
            bias: Some(&bs),
            bias_up: glu.then_some(&bs),
            n_expert,
            x: if glu { &xs } else { &hs },
            x_div: if glu { n_used } else { 1 },
            y: &ys,
            ids: &ids_s,
            n_pairs,
            groups: Some(groups),
            combine: None,
            xq: None,
        };
        for glu in [true, false] {
            let a = args(glu);
            let mats = if glu { 2.0 } else { 1.0 };
            let flop = 2.0 * mats * f64::from(n_pairs) * f64::from(n_rows) * f64::from(n_cols);
            let mut line = format!("x{n_tokens} {}", if glu { "GLU " } else { "down" });
            let mut want = Vec::new();
            for (name, k) in [("64 pairs", &base), ("128", &wide), ("16", &narrow)] {
                ctx.fill(&yb, 0, yb.size(), f32::NAN.to_bits()).unwrap();
                let ns = gpu_ns(&ctx, 11, &|c| k.record(c, &a).unwrap());
                let got = crate::testkit::read(&ctx, &yb, outputs);
                let ok = against_first(&mut want, got, 1e-3);
                line += &format!(
                    " | {name} {:8.1} us {:4.0} TFLOP/s {ok}",
                    ns / 1e3,
                    flop / ns / 1e3
                );
            }
            println!("{line}");
        }
    }
}

/// The first way's outputs become `want` ("ref"); later ones are checked against them within
/// `rel` ("ok", or what differs).
fn against_first(want: &mut Vec<f32>, got: Vec<f32>, rel: f32) -> String {
    if want.is_empty() {
        *want = got;
        return "ref".to_string();
    }
    match crate::check_close(&got, want, rel) {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("WRONG ({e})"),
    }
}
