//! Timing of the decode attention (ignored tests, not correctness tests): a module of
//! `attention_decode`'s device tests, compiled only with the `bench` feature. Run on the device
//! with `cargo test -p octoflow-kernels --release --features bench --lib decode_ -- --ignored
//! --nocapture --test-threads=1`.

use octoflow_vk::testing::gpu_or_skip;
use octoflow_vk::Context;
use rand::SeedableRng;

use super::*;

/// Median GPU time (µs) of what `rec` records, over `reps` replays in one chain: each replay
/// after a marker dispatch (`marker`, excluded from the time) and, with `flush`, after
/// overwriting a buffer larger than the GPU's L2 (the KV cache is cold in a real decode step,
/// where the weights stream through the cache between two attentions of a layer).
fn median_us(
    ctx: &Context,
    reps: usize,
    flush: Option<&Buffer>,
    marker: &dyn Fn(&mut Chain),
    rec: &dyn Fn(&mut Chain),
) -> f64 {
    let mut chain = Chain::with_profiling(ctx).unwrap();
    let mut spans = Vec::new(); // dispatch index range of each replay's measured part
    for _ in 0..reps {
        if let Some(f) = flush {
            chain.fill(&f.whole(), 0x3f80_0000).unwrap();
        }
        chain.barrier().unwrap();
        marker(&mut chain);
        chain.compute_barrier().unwrap();
        let a = chain.dispatch_count();
        rec(&mut chain);
        spans.push(a..chain.dispatch_count());
        chain.compute_barrier().unwrap();
    }
    chain.run().unwrap(); // warm-up
    chain.run().unwrap();
    let t = chain.timings().unwrap().unwrap();
    let mut us: Vec<f64> = spans
        .into_iter()
        .map(|r| t[r].iter().map(|d| d.ns).sum::<f64>() * 1e-3)
        .collect();
    us.sort_by(f64::total_cmp);
    us[us.len() / 2]
}

/// GPU time (µs) per replay of `rec` recorded `n` times back to back (compute barriers between,
/// caches warm): the best of 3 runs of the chain.
fn hot_us(ctx: &Context, n: usize, rec: &dyn Fn(&mut Chain)) -> f64 {
    let mut chain = Chain::with_profiling(ctx).unwrap();
    for _ in 0..n {
        rec(&mut chain);
        chain.compute_barrier().unwrap();
    }
    chain.run().unwrap(); // warm-up
    let mut best = f64::MAX;
    for _ in 0..3 {
        chain.run().unwrap();
        let t = chain.timings().unwrap().unwrap();
        best = best.min(t.iter().map(|d| d.ns).sum::<f64>() * 1e-3 / n as f64);
    }
    best
}

/// (label, tokens, (n_head, n_head_kv), head_dim, capacity, window, position, table streams)
type TimingCase = (
    &'static str,
    usize,
    (usize, usize),
    usize,
    usize,
    usize,
    usize,
    usize,
);

/// Timing of decode shapes, the one-dispatch kernel against `attention.comp` (two dispatches
/// when it splits), then a sweep of decode layouts (not a correctness test): `cargo test -p
/// octoflow-kernels --release --features bench --lib decode_attention_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn decode_attention_timing() {
    let Some(ctx) = gpu_or_skip("decode_attention_timing") else {
        return;
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let k = Attention::new(&ctx).unwrap().without_coop();
    let flush = Buffer::new(
        &ctx,
        "flush",
        128 << 20,
        octoflow_vk::MemoryKind::DeviceLocal,
    )
    .unwrap();
    let tiny = {
        let mut pr = Problem::new(&mut rng, 1, (2, 1), (4, 4), 1, 1, 0);
        pr.start = 0;
        pr
    };
    let tiny_b = Bufs::new(&ctx, &tiny);
    let marker = |c: &mut Chain| record(c, &k, &tiny, &tiny_b, None);
    // the floor: a launch after a barrier, one key
    let floor_cold = median_us(&ctx, 30, Some(&flush), &marker, &marker);
    let floor_hot = hot_us(&ctx, 100, &marker);
    println!("floor (one key): {floor_cold:.2} us cold, {floor_hot:.2} us back to back");
    let sg = ctx.caps().subgroup.size;
    let cases: [TimingCase; 11] = [
        ("qwen tg@64", 1, (14, 2), 64, 4096, 0, 63, 0),
        ("qwen tg@600", 1, (14, 2), 64, 4096, 0, 599, 0),
        ("qwen tg@2000", 1, (14, 2), 64, 4096, 0, 1999, 0),
        ("qwen tg@4000", 1, (14, 2), 64, 4096, 0, 3999, 0),
        ("qwen 4tok@600", 4, (14, 2), 64, 4096, 0, 596, 0),
        ("smollm tg@600", 1, (9, 3), 64, 4096, 0, 599, 0),
        ("gemma tg@600 w512", 1, (4, 1), 256, 4096, 512, 599, 0),
        ("gemma tg@2000", 1, (4, 1), 256, 4096, 0, 1999, 0),
        ("qwen 8 streams@600", 8, (14, 2), 64, 1024, 0, 599, 8),
        ("qwen 32 streams@600", 32, (14, 2), 64, 1024, 0, 599, 32),
        ("qwen 128 streams@600", 128, (14, 2), 64, 1024, 0, 599, 128),
    ];
    // OCTOFLOW_DECODE_CASES=text: only the cases whose label holds it;
    // OCTOFLOW_DECODE_SWEEP=text: the same, each followed by a sweep of layouts
    let only = std::env::var("OCTOFLOW_DECODE_CASES").ok();
    let sweep = std::env::var("OCTOFLOW_DECODE_SWEEP").ok();
    for (label, n_tok, heads, hd, cap, window, p, streams) in cases {
        let skip = |f: &Option<String>| f.as_ref().is_some_and(|w| !label.contains(w.as_str()));
        if skip(&only) || skip(&sweep) {
            continue;
        }
        let seqs = streams.max(1);
        let mut pr = Problem::new(&mut rng, n_tok, heads, (hd, hd), cap, seqs * cap, window);
        pr.start = p;
        if streams > 0 {
            pr.table = Some((0..n_tok).map(|t| (p - t % 7, t * cap)).collect());
        }
        let b = Bufs::new(&ctx, &pr);
        let s = &pr.s;
        let args = AttentionArgs {
            kv: KvType::F32,
            q: &b.q.whole(),
            k: &b.k.whole(),
            v: &b.v.whole(),
            out: &b.out.whole(),
            n_tokens: n_tok as u32,
            n_head: s.n_head as u32,
            n_head_kv: s.n_head_kv as u32,
            head_dim: hd as u32,
            head_dim_v: hd as u32,
            n_kv_rows: cap as u32,
            window: window as u32,
            scale: s.scale,
            pos: &b.pos.whole(),
            pos_offset: 1,
            positions: if streams > 0 {
                Positions::Table
            } else {
                Positions::Run
            },
            sinks: None,
        };
        let old_plan = crate::attention::plan(ctx.caps(), &args);
        let old = |c: &mut Chain| k.record_plan(c, &args, old_plan).unwrap();
        let new_plan = plan(ctx.caps(), &args);
        let new = |c: &mut Chain| k.decode.record(c, &args, new_plan).unwrap();
        let t_old = median_us(&ctx, 30, Some(&flush), &marker, &old);
        let t_new = median_us(&ctx, 30, Some(&flush), &marker, &new);
        let hot_old = hot_us(&ctx, 100, &old);
        let hot = hot_us(&ctx, 100, &new);
        println!(
            "{label:>22}: attention.comp {t_old:6.2} us cold {hot_old:6.2} hot, \
             decode {t_new:6.2} cold {hot:6.2} hot  {new_plan:?}"
        );
        if sweep.is_none() {
            continue;
        }
        let mut res = Vec::new();
        let group = (heads.0 / heads.1) as u32;
        for wg in [64u32, 128, 256] {
            for lpk in [2u32, 4, 8, 16] {
                let nvl = (hd as u32).div_ceil(4);
                let kg = floor_pow2(wg / nvl).min(sg);
                if lpk > sg || wg < sg || kg * nvl > wg {
                    continue;
                }
                let tile = wg / lpk;
                for hb in [1, 2, group.div_ceil(2), group] {
                    if hb > group {
                        continue;
                    }
                    for min_chunk in [tile, 64] {
                        for target in [128u32, 256] {
                            let base = (n_tok * heads.1) as u32 * group.div_ceil(hb);
                            let split = target.div_ceil(base).clamp(1, 128);
                            let p = DecodePlan {
                                wg,
                                lpk,
                                hb,
                                kg,
                                split,
                                min_chunk: min_chunk.max(1),
                            };
                            let rec = |c: &mut Chain| k.decode.record(c, &args, p).unwrap();
                            res.push((hot_us(&ctx, 50, &rec), p));
                        }
                    }
                }
            }
        }
        res.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (t, p) in res.iter().take(12) {
            println!("      {t:7.2} us hot  {p:?}");
        }
    }
}

/// Timing, not a correctness test: one decode step's attention at model shapes, as separate
/// stages (per-head RMSNorm for gemma3, `rope_store`, the decode kernel, barriers between) and
/// fused (`record_fresh`), in the device's layout and with other lanes per key:
/// `cargo test -p octoflow-kernels --release --features bench --lib decode_fresh_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn decode_fresh_timing() {
    use crate::rms_norm::RmsNorm;
    use crate::rope::RopeMode;
    use crate::rope_store::{RopeStore, RopeStoreArgs};
    let Some(ctx) = gpu_or_skip("decode_fresh_timing") else {
        return;
    };
    let att = Attention::new(&ctx).unwrap();
    let rope = RopeStore::new(&ctx).unwrap();
    let norm = RmsNorm::new(&ctx).unwrap();
    let sg = ctx.caps().subgroup.size;
    // (label, n_head, n_head_kv, head_dim, window, qk norm, position)
    let cases = [
        ("qwen @64", 14, 2, 64, 0, false, 64),
        ("qwen @600", 14, 2, 64, 0, false, 600),
        ("smollm @64", 9, 3, 64, 0, false, 64),
        ("gemma @64", 4, 1, 256, 512, true, 64),
        ("gemma @600", 4, 1, 256, 512, true, 600),
        ("gpt-oss @64", 64, 8, 64, 0, false, 64),
        ("gpt-oss @64 w128", 64, 8, 64, 128, false, 64),
    ];
    let rows = 1024usize;
    let reps = 40;
    for (label, n_head, n_kv, hd, window, qk, start) in cases {
        let q = with(&ctx, "q", &vec![0.01f32; n_head * hd]);
        let k = with(&ctx, "k", &vec![0.01f32; n_kv * hd]);
        let v = with(&ctx, "v", &vec![0.01f32; n_kv * hd]);
        let kc = with(&ctx, "kc", &vec![0.02f32; rows * n_kv * hd]);
        let vc = with(&ctx, "vc", &vec![0.03f32; rows * n_kv * hd]);
        let w = with(&ctx, "w", &vec![1.0f32; hd]);
        let ob = poisoned(&ctx, "out", n_head * hd);
        let pb = with(&ctx, "pos", &[start as u32]);
        let (qw, kw, vw, kcw, vcw, ww, ow, pw) = (
            q.whole(),
            k.whole(),
            v.whole(),
            kc.whole(),
            vc.whole(),
            w.whole(),
            ob.whole(),
            pb.whole(),
        );
        let args = AttentionArgs {
            kv: KvType::F32,
            q: &qw,
            k: &kcw,
            v: &vcw,
            out: &ow,
            n_tokens: 1,
            n_head: n_head as u32,
            n_head_kv: n_kv as u32,
            head_dim: hd as u32,
            head_dim_v: hd as u32,
            n_kv_rows: rows as u32,
            window,
            scale: 0.125,
            pos: &pw,
            pos_offset: 0,
            positions: Positions::Run,
            sinks: None,
        };
        let freqs: Vec<f64> = (0..hd / 2)
            .map(|i| 10000f64.powf(-2.0 * i as f64 / hd as f64))
            .collect();
        let table = crate::rope::RopeFreqs::upload(&ctx, "rope_freqs", &freqs, 1.0).unwrap();
        let fresh = FreshKv {
            k: &kw,
            v: &vw,
            n_ctx: rows as u32,
            mode: RopeMode::Neox,
            freqs: &table,
            qk_norm: qk.then_some((&ww, &ww, 1e-6)),
        };
        let base = plan(ctx.caps(), &args);
        let time = |rec: &dyn Fn(&mut Chain)| -> f64 {
            let build = || {
                let mut chain = Chain::new(&ctx).unwrap();
                for _ in 0..reps {
                    rec(&mut chain);
                    chain.compute_barrier().unwrap();
                }
                chain
            };
            build().run().unwrap(); // pipeline compile
            let mut chain = build();
            // clocks up: ~150 ms of work before measuring
            let t0 = std::time::Instant::now();
            while t0.elapsed().as_secs_f64() < 0.15 {
                chain.run().unwrap();
            }
            let mut best = f64::MAX;
            for _ in 0..10 {
                let t = std::time::Instant::now();
                chain.run().unwrap();
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            best * 1e6
        };
        let separate = time(&|chain: &mut Chain| {
            if qk {
                norm.record(chain, &qw, &ww, &qw, n_head as u32, hd as u32, 1e-6)
                    .unwrap();
                norm.record(chain, &kw, &ww, &kw, n_kv as u32, hd as u32, 1e-6)
                    .unwrap();
                chain.compute_barrier().unwrap();
            }
            let ra = RopeStoreArgs {
                kv: KvType::F32,
                q: &qw,
                k: &kw,
                v: &vw,
                k_cache: &kcw,
                v_cache: &vcw,
                n_ctx: rows as u32,
                n_tokens: 1,
                n_head: n_head as u32,
                n_head_kv: n_kv as u32,
                head_dim: hd as u32,
                head_dim_v: hd as u32,
                mode: RopeMode::Neox,
                freqs: &table,
                pos: &pw,
                pos_offset: 0,
                positions: Positions::Run,
            };
            rope.record(chain, &ra).unwrap();
            chain.compute_barrier().unwrap();
            att.decode.record(chain, &args, base).unwrap();
        });
        println!("{label:>12}: separate stages {separate:7.2} us  (layout {base:?})");
        let group = (n_head / n_kv) as u32;
        let nvl = (hd as u32).div_ceil(4);
        for wg in [128u32, 256] {
            for lpk in [4u32, 8, 16] {
                if hd < 256 && lpk == 16 {
                    continue;
                }
                let mut hbs = vec![1, 2];
                hbs.dedup();
                for hb in hbs.into_iter().filter(|&h| h <= group) {
                    let kg = floor_pow2(wg / nvl).min(sg);
                    if lpk > sg || wg < sg || kg == 0 {
                        continue;
                    }
                    let p = DecodePlan {
                        wg,
                        lpk,
                        hb,
                        kg,
                        ..base
                    };
                    let plain =
                        time(&|chain: &mut Chain| att.decode.record(chain, &args, p).unwrap());
                    let fused = time(&|chain: &mut Chain| {
                        att.decode.record_fresh(chain, &args, &fresh, p).unwrap()
                    });
                    println!(
                        "{label:>12}: wg {wg:3} lpk {lpk:2} hb {hb}: attention only {plain:7.2} us, fused {fused:7.2} us"
                    );
                }
            }
        }
    }
}
