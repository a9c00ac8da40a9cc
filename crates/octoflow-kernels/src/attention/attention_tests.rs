//! Device tests of `attention.rs`.

use octoflow_vk::testing::gpu_or_skip;
use rand::Rng;

use super::*;
use crate::attention::page::Paged;
use crate::check_close;
use crate::testkit::{poisoned, read, with};

/// f32 dot products over up to 256 dims (vec4 pieces, then a butterfly across lanes) and an
/// online softmax over up to ~4000 keys (rescaled per key block, split pieces merged), against
/// an f64 reference: a few 1e-6 typical, 1e-4 bound (outputs near zero are judged against 1%
/// of the largest).
const REL: f32 = 1e-4;

/// (n_tokens, n_head, n_head_kv, head_dim, head_dim_v, n_kv_rows, window, start)
type Case = (usize, usize, usize, usize, usize, usize, usize, usize);

/// `[n_head]` random sink logits, in the scores' range so that they matter.
fn random_sinks(rng: &mut impl Rng, n_head: usize) -> Vec<f32> {
    (0..n_head).map(|_| rng.gen_range(-2.0..4.0)).collect()
}

/// Runs one case on fresh random inputs (with `plan`, or the device's own choice; with random
/// sink logits when `sinks`) and returns the mismatch, if any, as an error naming the case.
fn run_case(
    ctx: &Context,
    k: &Attention,
    rng: &mut impl Rng,
    c: Case,
    plan: Option<Plan>,
    sinks: bool,
    kv: KvType,
) -> std::result::Result<(), String> {
    let (n_tok, n_head, n_kv, hd, hv, rows, window, start) = c;
    let sink_logits = random_sinks(rng, n_head);
    let s = AttentionShape {
        n_head,
        n_head_kv: n_kv,
        head_dim: hd,
        head_dim_v: hv,
        n_kv_rows: rows,
        window,
        scale: 1.0 / (hd as f32).sqrt(),
        sinks: sinks.then_some(sink_logits.as_slice()),
    };
    let mut gen = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect() };
    let q = gen(n_tok * n_head * hd);
    // the caches as they hold the values (the reference reads the same rounded values)
    let kc = kv.decode(&kv.encode(&gen(rows * n_kv * hd)));
    let vc = kv.decode(&kv.encode(&gen(rows * n_kv * hv)));
    let qb = with(ctx, "q", &q);
    let (kb, vb) = (
        with(ctx, "k", &kv.encode(&kc)),
        with(ctx, "v", &kv.encode(&vc)),
    );
    let ob = poisoned(ctx, "out", n_tok * n_head * hv);
    let pb = with(ctx, "pos", &[3u32, 1, start as u32]);
    let sb = with(ctx, "sinks", &sink_logits);
    let sw = sb.whole();
    let args = AttentionArgs {
        kv,
        q: &qb.whole(),
        k: &kb.whole(),
        v: &vb.whole(),
        out: &ob.whole(),
        n_tokens: n_tok as u32,
        n_head: n_head as u32,
        n_head_kv: n_kv as u32,
        head_dim: hd as u32,
        head_dim_v: hv as u32,
        n_kv_rows: rows as u32,
        window: window as u32,
        scale: s.scale,
        pos: &pb.whole(),
        pos_offset: 2,
        positions: Positions::Run,
        sinks: sinks.then_some(&sw),
    };
    let mut chain = Chain::new(ctx).unwrap();
    match plan {
        Some(p) => k.record_plan(&mut chain, &args, p).unwrap(),
        None => k.record(&mut chain, &args).unwrap(),
    }
    chain.run().unwrap();
    let mut want = vec![0f32; n_tok * n_head * hv];
    attention_ref(&s, &q, &kc, &vc, start, &mut want);
    check_close(&read(ctx, &ob, want.len()), &want, REL).map_err(|e| {
        format!(
            "attention {n_tok} tokens {n_head}/{n_kv} heads {hd}/{hv} rows {rows} \
             window {window} at {start}, sinks {sinks}, plan {plan:?}, {kv} caches: {e}"
        )
    })
}

#[test]
fn gpu_attention_matches_the_reference_on_random_inputs() {
    let Some(ctx) = gpu_or_skip("gpu_attention_matches_the_reference") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Attention::new(&ctx).unwrap().without_coop();
    let cases: [Case; 13] = [
        (1, 9, 3, 64, 64, 600, 0, 577),
        (37, 9, 3, 64, 64, 600, 0, 211),
        (1, 4, 1, 256, 256, 520, 0, 519),
        (37, 4, 1, 256, 256, 300, 16, 100),
        (1, 4, 1, 256, 256, 600, 5, 590),
        (37, 9, 3, 64, 64, 200, 130, 150), // last queries past the cache end
        (3, 2, 2, 40, 24, 10, 0, 0),
        (1, 8, 2, 128, 96, 2000, 0, 1999),
        (1, 9, 3, 64, 64, 4096, 0, 3000), // decode, long context: split-K
        (1, 4, 1, 256, 256, 4096, 512, 4000), // split-K inside a sliding window
        (5, 14, 2, 64, 64, 100, 0, 7),    // GQA group of 7
        (6, 6, 2, 38, 22, 50, 0, 10),     // dims not multiples of 4
        (64, 9, 3, 64, 64, 512, 0, 256),  // a prefill chunk at a later position
    ];
    // every case with f32 caches, every third also with f16 ones where the device has them,
    // another third with q8_0 ones (whole blocks)
    let f16 = KvType::F16.supported(ctx.caps());
    let runs = (cases.iter().enumerate().map(|(i, &c)| (i, c, KvType::F32)))
        .chain(
            (cases.iter().enumerate())
                .filter(|(i, _)| f16 && i % 3 == 0)
                .map(|(i, &c)| (i, c, KvType::F16)),
        )
        .chain(
            (cases.iter().enumerate())
                .filter(|(i, c)| i % 3 == 1 && c.3 % 32 == 0 && c.4 % 32 == 0)
                .map(|(i, &c)| (i, c, KvType::Q8_0)),
        );
    for (i, c, kv) in runs {
        // every other case with sinks
        if let Err(e) = run_case(&ctx, &k, &mut rng, c, None, i % 2 == 1, kv) {
            panic!("{e}, seed {seed}");
        }
    }
}

#[test]
fn every_work_layout_matches_the_reference() {
    let Some(ctx) = gpu_or_skip("attention_work_layouts") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Attention::new(&ctx).unwrap().without_coop();
    let sg = ctx.caps().subgroup.size;
    let cases: [Case; 4] = [
        (7, 9, 3, 64, 64, 300, 0, 250),
        (5, 4, 1, 256, 256, 300, 40, 200),
        (3, 6, 2, 38, 22, 60, 0, 30),
        (1, 8, 2, 128, 96, 700, 0, 699),
    ];
    // (lanes per cluster, heads per cluster, tokens per cluster, split): odd splits, partial
    // head chunks and token blocks, one-lane clusters; wide clusters where subgroups allow
    let plans = [
        (8, 3, 2, 5),
        (4, 2, 3, 1),
        (2, 1, 1, 64),
        (16, 4, 1, 3),
        (32, 1, 2, 2),
    ];
    for (ci, c) in cases.into_iter().enumerate() {
        for (pi, (cl, hpl, tpl, split)) in plans.into_iter().enumerate() {
            if cl > sg {
                continue;
            }
            let p = Plan {
                wg: 32.max(cl),
                cl,
                hpl,
                tpl,
                split,
            };
            let sinks = (ci + pi) % 2 == 1;
            if let Err(e) = run_case(&ctx, &k, &mut rng, c, Some(p), sinks, KvType::F32) {
                panic!("{e}, seed {seed}");
            }
        }
    }
}

/// Timing of model-like shapes (not a correctness test): `cargo test -p octoflow-kernels
/// attention_timing -- --ignored --nocapture`.
#[test]
#[ignore]
fn attention_timing() {
    let Some(ctx) = gpu_or_skip("attention_timing") else {
        return;
    };
    let coop = Attention::new(&ctx).unwrap();
    let plain = Attention::new(&ctx).unwrap().without_coop();
    // (label, n_tokens, n_head, n_head_kv, head_dim, window, start)
    let cases = [
        ("qwen pp512@0", 512, 14, 2, 64, 0, 0),
        ("smollm pp64@0", 64, 9, 3, 64, 0, 0),
        ("smollm pp256@256", 256, 9, 3, 64, 0, 256),
        ("smollm tg@64", 1, 9, 3, 64, 0, 64),
        ("smollm tg@511", 1, 9, 3, 64, 0, 511),
        ("smollm tg@4000", 1, 9, 3, 64, 0, 4000),
        ("smollm pp512@0", 512, 9, 3, 64, 0, 0),
        ("gemma pp64@0", 64, 4, 1, 256, 512, 0),
        ("gemma pp256@256", 256, 4, 1, 256, 512, 256),
        ("gemma tg@511", 1, 4, 1, 256, 512, 511),
        ("qwen pp512@8192", 512, 14, 2, 64, 0, 8192),
        ("qwen pp512@31488", 512, 14, 2, 64, 0, 31488),
        ("llama pp512@8192", 512, 32, 8, 128, 0, 8192),
    ];
    for (label, n_tok, n_head, n_kv, hd, window, start) in cases {
        let rows = (start + n_tok).max(4096);
        let q = with(&ctx, "q", &vec![0.01f32; n_tok * n_head * hd]);
        let kc = with(&ctx, "k", &vec![0.02f32; rows * n_kv * hd]);
        let vc = with(&ctx, "v", &vec![0.03f32; rows * n_kv * hd]);
        let ob = poisoned(&ctx, "out", n_tok * n_head * hd);
        let pb = with(&ctx, "pos", &[start as u32]);
        let args = AttentionArgs {
            kv: KvType::F32,
            q: &q.whole(),
            k: &kc.whole(),
            v: &vc.whole(),
            out: &ob.whole(),
            n_tokens: n_tok as u32,
            n_head: n_head as u32,
            n_head_kv: n_kv as u32,
            head_dim: hd as u32,
            head_dim_v: hd as u32,
            n_kv_rows: rows as u32,
            window,
            scale: 0.125,
            pos: &pb.whole(),
            pos_offset: 0,
            positions: Positions::Run,
            sinks: None,
        };
        let reps = 5;
        for (path, k) in [("", &plain), (" coop", &coop)] {
            let mut chain = Chain::new(&ctx).unwrap();
            for _ in 0..reps {
                k.record(&mut chain, &args).unwrap();
                chain.barrier().unwrap();
            }
            chain.run().unwrap(); // warm-up (pipeline compile)
            let (mut best, mut best_gpu) = (f64::MAX, f64::MAX);
            for _ in 0..3 {
                let mut chain = Chain::with_profiling(&ctx).unwrap();
                for _ in 0..reps {
                    k.record(&mut chain, &args).unwrap();
                    chain.barrier().unwrap();
                }
                let t = std::time::Instant::now();
                chain.run().unwrap();
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
                let gpu: f64 = chain.timings().unwrap().unwrap().iter().map(|d| d.ns).sum();
                best_gpu = best_gpu.min(gpu * 1e-9 / reps as f64);
            }
            let layout = if crate::attention_decode::applies(&args) {
                format!("{:?}", crate::attention_decode::plan(ctx.caps(), &args))
            } else {
                format!("{:?}", plan(ctx.caps(), &args))
            };
            println!(
                "{label:>18}{path}: {:9.1} us wall {:9.1} us GPU  {layout}",
                best * 1e6,
                best_gpu * 1e6
            );
        }
    }
}

#[test]
fn bad_head_counts_and_short_caches_are_shape_errors() {
    let Some(ctx) = gpu_or_skip("attention_shape_errors") else {
        return;
    };
    let b = poisoned(&ctx, "b", 4096);
    let kc = poisoned(&ctx, "k_cache_l0", 64);
    let pb = with(&ctx, "pos", &[0u32]);
    let k = Attention::new(&ctx).unwrap().without_coop();
    let mut chain = Chain::new(&ctx).unwrap();
    let mut args = AttentionArgs {
        kv: KvType::F32,
        q: &b.whole(),
        k: &b.whole(),
        v: &b.whole(),
        out: &b.whole(),
        n_tokens: 1,
        n_head: 9,
        n_head_kv: 2,
        head_dim: 64,
        head_dim_v: 64,
        n_kv_rows: 4,
        window: 0,
        scale: 0.125,
        pos: &pb.whole(),
        pos_offset: 0,
        positions: Positions::Run,
        sinks: None,
    };
    let err = k.record(&mut chain, &args).unwrap_err().to_string();
    assert!(err.contains("n_head 9"), "{err}");
    args.n_head_kv = 3;
    let ks = kc.whole();
    args.k = &ks;
    let err = k.record(&mut chain, &args).unwrap_err().to_string();
    assert!(err.contains("k_cache_l0"), "{err}");
    let bs = b.whole();
    args.k = &bs;
    args.head_dim = 512;
    let err = k.record(&mut chain, &args).unwrap_err().to_string();
    assert!(err.contains("head_dim 512"), "{err}");
    args.head_dim = 64;
    let short = with(&ctx, "attn_sinks", &[0f32; 8]);
    let ss = short.whole();
    args.sinks = Some(&ss);
    let err = k.record(&mut chain, &args).unwrap_err().to_string();
    assert!(err.contains("sinks") && err.contains("attn_sinks"), "{err}");
}

#[test]
fn position_table_attends_each_query_to_its_own_sequence() {
    let Some(ctx) = gpu_or_skip("attention_position_table") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Attention::new(&ctx).unwrap().without_coop();
    // (n_head, n_head_kv, head_dim, head_dim_v, rows per sequence, window, sequences, queries)
    for (i, (n_head, n_kv, hd, hv, rows, window, n_seq, n_tok)) in [
        (9, 3, 64, 64, 300, 0, 5, 11),
        (4, 1, 256, 256, 200, 16, 3, 7),
        (6, 2, 38, 22, 40, 0, 4, 9),
        (14, 2, 64, 64, 2000, 0, 3, 3), // long sequences: split-K
    ]
    .into_iter()
    .enumerate()
    {
        let sink_logits = random_sinks(&mut rng, n_head);
        let sinks = i % 2 == 1;
        let sb = with(&ctx, "sinks", &sink_logits);
        let sw = sb.whole();
        let s = AttentionShape {
            n_head,
            n_head_kv: n_kv,
            head_dim: hd,
            head_dim_v: hv,
            n_kv_rows: rows,
            window,
            scale: 1.0 / (hd as f32).sqrt(),
            sinks: sinks.then_some(sink_logits.as_slice()),
        };
        // the sequences' blocks shuffled over a pool
        let paged = Paged::random(&mut rng, n_seq, rows);
        let mut gen = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect() };
        let q = gen(n_tok * n_head * hd);
        let kc = gen(paged.pool_rows * n_kv * hd);
        let vc = gen(paged.pool_rows * n_kv * hv);
        // query t: a random sequence and position; a few at the ends of the range
        let table: Vec<(usize, usize)> = (0..n_tok)
            .map(|t| {
                let seq = rng.gen_range(0..n_seq);
                let p = match t % 4 {
                    0 => 0,
                    1 => rows - 1,
                    _ => rng.gen_range(0..rows),
                };
                (p, seq)
            })
            .collect();
        let mut words = vec![5u32]; // pos_offset 1
        words.resize(1 + 2 * n_tok, 0);
        let at = paged.append_to(&mut words);
        for (t, &(p, seq)) in table.iter().enumerate() {
            words[1 + 2 * t] = p as u32;
            words[2 + 2 * t] = at[seq];
        }
        let (qb, kb, vb) = (
            with(&ctx, "q", &q),
            with(&ctx, "k", &kc),
            with(&ctx, "v", &vc),
        );
        let ob = poisoned(&ctx, "out", n_tok * n_head * hv);
        let pb = with(&ctx, "pos", &words);
        let args = AttentionArgs {
            kv: KvType::F32,
            q: &qb.whole(),
            k: &kb.whole(),
            v: &vb.whole(),
            out: &ob.whole(),
            n_tokens: n_tok as u32,
            n_head: n_head as u32,
            n_head_kv: n_kv as u32,
            head_dim: hd as u32,
            head_dim_v: hv as u32,
            n_kv_rows: rows as u32,
            window: window as u32,
            scale: s.scale,
            pos: &pb.whole(),
            pos_offset: 1,
            positions: Positions::Table,
            sinks: sinks.then_some(&sw),
        };
        let mut want = vec![0f32; n_tok * n_head * hv];
        let (kw, vw) = (n_kv * hd, n_kv * hv);
        for (t, &(p, seq)) in table.iter().enumerate() {
            let qt = &q[t * n_head * hd..(t + 1) * n_head * hd];
            let ks = paged.gather(&kc, kw, seq, rows);
            let vs = paged.gather(&vc, vw, seq, rows);
            let out = &mut want[t * n_head * hv..(t + 1) * n_head * hv];
            attention_ref(&s, qt, &ks, &vs, p, out);
        }
        // Attention::record (the decode kernel for position tables), then attention.comp
        for old in [false, true] {
            let bytes = 4 * want.len() as u64;
            ctx.fill(&ob, 0, bytes, f32::NAN.to_bits()).unwrap();
            let mut chain = Chain::new(&ctx).unwrap();
            if old {
                k.record_plan(&mut chain, &args, plan(ctx.caps(), &args))
                    .unwrap();
            } else {
                k.record(&mut chain, &args).unwrap();
            }
            chain.run().unwrap();
            if let Err(e) = check_close(&read(&ctx, &ob, want.len()), &want, REL) {
                panic!(
                    "attention table {n_head}/{n_kv} heads {hd}/{hv}, {n_seq} sequences of \
                     {rows}, window {window}, {n_tok} queries, sinks {sinks}, attention.comp \
                     {old}, seed {seed}: {e}"
                );
            }
        }
    }
}
