//! Device tests of `attention_decode.rs` against `attention_ref`.

use octoflow_vk::testing::gpu_or_skip;
use octoflow_vk::{Buffer, Context};
use rand::Rng;

use super::*;
use crate::attention::page::Paged;
use crate::attention::{attention_ref, Attention, AttentionShape};
use crate::check_close;
use crate::kv_type::check_q8;
use crate::testkit::{poisoned, read, with};
use crate::KvType;

/// f32 dot products over up to 256 dims (vec4 pieces, then a butterfly across lanes), an online
/// softmax over tiles of keys and up to 64 merged pieces, against an f64 reference: up to ~4e-5
/// measured (lavapipe and H100; outputs near zero are judged against 1% of the largest), 1e-4
/// bound.
const REL: f32 = 1e-4;
/// The fused step's stored f16 keys: the kernel and the reference round f32 values that differ
/// by the rotation's ~1e-6, so a stored key may sit one f16 step (2^-11 relative) away from the
/// reference's.
const REL_F16: f32 = 1e-3;

/// The largest relative error as [`check_close`] measures it (for the report; NaN gives inf).
fn max_rel(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
    got.iter().zip(want).fold(0f32, |e, (&g, &w)| {
        let d = (g - w).abs() / w.abs().max(0.01 * scale).max(f32::MIN_POSITIVE);
        if d.is_finite() {
            e.max(d)
        } else {
            f32::INFINITY
        }
    })
}

/// One attention problem: cache contents, queries and where they sit.
struct Problem {
    s: AttentionShape<'static>,
    /// `[n_head]` sink logits, or none.
    sinks: Option<Vec<f32>>,
    n_tok: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// Run mode: start position. Table mode: per token (position, sequence), the sequences'
    /// blocks in `paged` (`k` and `v` are its pool).
    start: usize,
    table: Option<Vec<(usize, usize)>>,
    paged: Option<Paged>,
    /// What the caches hold (`k` and `v` are already rounded to it).
    kv: KvType,
}

impl Problem {
    /// Fresh random inputs for `n_tok` tokens over `cache_rows` rows of cache.
    #[allow(clippy::too_many_arguments)]
    fn new(
        rng: &mut impl Rng,
        n_tok: usize,
        (n_head, n_kv): (usize, usize),
        (hd, hv): (usize, usize),
        rows: usize,
        cache_rows: usize,
        window: usize,
    ) -> Self {
        let s = AttentionShape {
            n_head,
            n_head_kv: n_kv,
            head_dim: hd,
            head_dim_v: hv,
            n_kv_rows: rows,
            window,
            scale: 1.0 / (hd as f32).sqrt(),
            sinks: None,
        };
        let mut gen = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect() };
        Problem {
            s,
            sinks: None,
            n_tok,
            q: gen(n_tok * n_head * hd),
            k: gen(cache_rows * n_kv * hd),
            v: gen(cache_rows * n_kv * hv),
            start: 0,
            table: None,
            paged: None,
            kv: KvType::F32,
        }
    }

    /// With caches of `kv`: the cache contents rounded to it, so that the reference reads what
    /// the kernel reads.
    fn with_kv(mut self, kv: KvType) -> Self {
        self.k = kv.decode(&kv.encode(&self.k));
        self.v = kv.decode(&kv.encode(&self.v));
        self.kv = kv;
        self
    }

    /// With random sink logits (in the scores' range, so that they matter) when `on`.
    fn with_sinks(mut self, rng: &mut impl Rng, on: bool) -> Self {
        self.sinks = on.then(|| {
            (0..self.s.n_head)
                .map(|_| rng.gen_range(-2.0..4.0))
                .collect()
        });
        self
    }

    /// The reference output.
    fn want(&self) -> Vec<f32> {
        let s = &AttentionShape {
            sinks: self.sinks.as_deref(),
            ..self.s
        };
        let mut want = vec![0f32; self.n_tok * s.n_head * s.head_dim_v];
        match &self.table {
            None => attention_ref(s, &self.q, &self.k, &self.v, self.start, &mut want),
            Some(table) => {
                let paged = self.paged.as_ref().expect("a table problem has blocks");
                let (kw, vw) = (s.n_head_kv * s.head_dim, s.n_head_kv * s.head_dim_v);
                let (qw, ow) = (s.n_head * s.head_dim, s.n_head * s.head_dim_v);
                for (t, &(p, seq)) in table.iter().enumerate() {
                    let n = s.n_kv_rows;
                    attention_ref(
                        s,
                        &self.q[t * qw..][..qw],
                        &paged.gather(&self.k, kw, seq, n),
                        &paged.gather(&self.v, vw, seq, n),
                        p,
                        &mut want[t * ow..][..ow],
                    );
                }
            }
        }
        want
    }

    /// The `pos` words (offset 1) for this problem.
    fn pos_words(&self) -> Vec<u32> {
        let mut words = vec![7u32];
        match &self.table {
            None => words.push(self.start as u32),
            Some(t) => {
                words.resize(1 + 2 * t.len(), 0);
                let paged = self.paged.as_ref().expect("a table problem has blocks");
                let at = paged.append_to(&mut words);
                for (i, &(p, seq)) in t.iter().enumerate() {
                    words[1 + 2 * i] = p as u32;
                    words[2 + 2 * i] = at[seq];
                }
            }
        }
        words
    }
}

/// Device buffers of a problem.
struct Bufs {
    q: Buffer,
    k: Buffer,
    v: Buffer,
    out: Buffer,
    pos: Buffer,
    sinks: Option<Buffer>,
}

impl Bufs {
    fn new(ctx: &Context, pr: &Problem) -> Self {
        Bufs {
            q: with(ctx, "q", &pr.q),
            k: with(ctx, "k", &pr.kv.encode(&pr.k)),
            v: with(ctx, "v", &pr.kv.encode(&pr.v)),
            out: poisoned(ctx, "out", pr.n_tok * pr.s.n_head * pr.s.head_dim_v),
            pos: with(ctx, "pos", &pr.pos_words()),
            sinks: pr.sinks.as_ref().map(|x| with(ctx, "sinks", x)),
        }
    }
}

/// Records attention of `pr` into `chain`: with `plan` through the decode kernel, else through
/// [`Attention::record`] (which must pick the decode kernel for these shapes).
fn record(chain: &mut Chain, k: &Attention, pr: &Problem, b: &Bufs, plan: Option<DecodePlan>) {
    let s = &pr.s;
    let sinks = b.sinks.as_ref().map(|x| x.whole());
    let args = AttentionArgs {
        q: &b.q.whole(),
        k: &b.k.whole(),
        v: &b.v.whole(),
        out: &b.out.whole(),
        n_tokens: pr.n_tok as u32,
        n_head: s.n_head as u32,
        n_head_kv: s.n_head_kv as u32,
        head_dim: s.head_dim as u32,
        head_dim_v: s.head_dim_v as u32,
        n_kv_rows: s.n_kv_rows as u32,
        window: s.window as u32,
        scale: s.scale,
        pos: &b.pos.whole(),
        pos_offset: 1,
        kv: pr.kv,
        positions: if pr.table.is_some() {
            Positions::Table
        } else {
            Positions::Run
        },
        sinks: sinks.as_ref(),
    };
    assert!(applies(&args), "not a decode shape");
    let before = chain.dispatch_count();
    match plan {
        Some(p) => k.decode.record(chain, &args, p).unwrap(),
        None => k.record(chain, &args).unwrap(),
    }
    assert_eq!(chain.dispatch_count(), before + 1, "one dispatch");
}

/// Runs `pr` once; the largest relative error, or the mismatch naming `what`.
fn run(
    ctx: &Context,
    k: &Attention,
    pr: &Problem,
    plan: Option<DecodePlan>,
    what: &str,
) -> std::result::Result<f32, String> {
    let b = Bufs::new(ctx, pr);
    let mut chain = Chain::new(ctx).unwrap();
    record(&mut chain, k, pr, &b, plan);
    chain.run().unwrap();
    let want = pr.want();
    let got = read(ctx, &b.out, want.len());
    check_close(&got, &want, REL).map_err(|e| format!("{what}, plan {plan:?}: {e}"))?;
    Ok(max_rel(&got, &want))
}

/// (n_tokens, (n_head, n_head_kv), (head_dim, head_dim_v), n_kv_rows, window, start)
type Case = (usize, (usize, usize), (usize, usize), usize, usize, usize);

fn run_case(
    ctx: &Context,
    k: &Attention,
    rng: &mut impl Rng,
    c: Case,
    plan: Option<DecodePlan>,
    sinks: bool,
    kv: KvType,
) -> std::result::Result<f32, String> {
    let (n_tok, heads, dims, rows, window, start) = c;
    let mut pr = Problem::new(rng, n_tok, heads, dims, rows, rows, window)
        .with_sinks(rng, sinks)
        .with_kv(kv);
    pr.start = start;
    run(
        ctx,
        k,
        &pr,
        plan,
        &format!("decode case {c:?}, sinks {sinks}, {kv} caches"),
    )
}

#[test]
fn decode_attention_matches_the_reference_on_random_inputs() {
    let Some(ctx) = gpu_or_skip("decode_attention_matches_the_reference") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Attention::new(&ctx).unwrap().without_coop();
    let cases: [Case; 22] = [
        // contexts 1, 7, 33, 600, 2000 at qwen2.5-0.5B's shape (GQA 7)
        (1, (14, 2), (64, 64), 4096, 0, 0),
        (1, (14, 2), (64, 64), 4096, 0, 6),
        (1, (14, 2), (64, 64), 4096, 0, 32),
        (1, (14, 2), (64, 64), 4096, 0, 599),
        (1, (14, 2), (64, 64), 4096, 0, 1999),
        // no grouping, and one KV head for 8 query heads
        (1, (4, 4), (64, 64), 2048, 0, 32),
        (1, (4, 4), (64, 64), 2048, 0, 1999),
        (1, (8, 1), (64, 64), 2048, 0, 599),
        (1, (8, 1), (256, 256), 2048, 0, 6),
        // gemma3: head_dim 256, sliding window
        (1, (4, 1), (256, 256), 2048, 0, 599),
        (1, (4, 1), (256, 256), 2048, 512, 1999),
        (1, (4, 1), (256, 256), 2048, 512, 300), // window longer than the context
        (1, (14, 2), (64, 64), 4096, 33, 1999),
        // several tokens of one run (speculative decoding, short prompts)
        (4, (14, 2), (64, 64), 1024, 0, 597),
        (8, (8, 1), (256, 256), 700, 100, 650),
        (8, (14, 2), (64, 64), 64, 0, 0),
        // last queries past the cache end (they see up to row n_kv_rows - 1)
        (5, (9, 3), (64, 64), 200, 0, 197),
        // odd widths, other value width
        (3, (6, 2), (38, 22), 60, 0, 30),
        (1, (4, 1), (128, 96), 2000, 0, 1999),
        // GQA groups cut into head chunks (16 -> 2 x 8, 10 -> 2 x 5)
        (2, (32, 2), (64, 64), 600, 0, 500),
        (1, (20, 2), (64, 64), 300, 0, 299),
        (1, (12, 1), (256, 256), 1000, 0, 999),
    ];
    let mut worst = 0f32;
    // every case with f32 caches, every third also with f16 ones (where the device has them),
    // another third with q8_0 ones (whole blocks)
    let f16 = KvType::F16.supported(ctx.caps());
    let runs = cases
        .iter()
        .enumerate()
        .map(|(i, &c)| (i, c, KvType::F32))
        .chain(
            (cases.iter().enumerate())
                .filter(|(i, _)| f16 && i % 3 == 0)
                .map(|(i, &c)| (i, c, KvType::F16)),
        )
        .chain(
            (cases.iter().enumerate())
                .filter(|(i, &(_, _, (hd, hv), ..))| i % 3 == 1 && hd % 32 == 0 && hv % 32 == 0)
                .map(|(i, &c)| (i, c, KvType::Q8_0)),
        );
    for (i, c, kv) in runs {
        // every other case with sinks
        match run_case(&ctx, &k, &mut rng, c, None, i % 2 == 1, kv) {
            Ok(e) => worst = worst.max(e),
            Err(e) => panic!("{e}, seed {seed}"),
        }
    }
    println!("decode attention: max relative error {worst:.2e}");
}

#[test]
fn every_decode_layout_matches_the_reference() {
    let Some(ctx) = gpu_or_skip("decode_attention_layouts") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Attention::new(&ctx).unwrap().without_coop();
    let sg = ctx.caps().subgroup.size;
    let cases: [Case; 5] = [
        (1, (14, 2), (64, 64), 700, 0, 650),
        (2, (4, 1), (256, 256), 400, 40, 350),
        (3, (6, 2), (38, 22), 60, 0, 40),
        (1, (8, 2), (128, 96), 300, 0, 299),
        (1, (4, 4), (64, 64), 100, 0, 0),
    ];
    // (wg, lanes per key, heads per workgroup (0: the whole group), key groups, split, min
    // chunk): one-lane keys, partial head chunks, one and many pieces, pieces of one key, pieces
    // of many tiles, odd splits
    let layouts = [
        (128, 4, 0, 8, 1, 32),
        (128, 1, 3, 4, 5, 1),
        (64, 2, 1, 2, 64, 1),
        (128, 8, 0, 1, 7, 200),
        (256, 4, 2, 8, 3, 16),
        (64, 8, 5, 8, 2, 1),
        (128, 16, 0, 16, 9, 20),
        (256, 32, 4, 32, 4, 64),
    ];
    let mut worst = 0f32;
    let mut ran = 0;
    for (ci, c) in cases.into_iter().enumerate() {
        let (_, (n_head, n_kv), (_, hv), ..) = c;
        for (li, (wg, lpk, hb, kg, split, min_chunk)) in layouts.into_iter().enumerate() {
            let group = (n_head / n_kv) as u32;
            let p = DecodePlan {
                wg,
                lpk,
                hb: if hb == 0 { group } else { hb.min(group) },
                kg,
                split,
                min_chunk,
            };
            if lpk > sg || kg > sg || wg < sg || kg as usize * hv.div_ceil(4) > wg as usize {
                continue;
            }
            match run_case(
                &ctx,
                &k,
                &mut rng,
                c,
                Some(p),
                (ci + li) % 2 == 1,
                KvType::F32,
            ) {
                Ok(e) => worst = worst.max(e),
                Err(e) => panic!("{e}, seed {seed}"),
            }
            ran += 1;
        }
    }
    assert!(ran >= 15, "only {ran} layouts fit subgroups of {sg}");
    println!("decode attention layouts ({ran} runs): max relative error {worst:.2e}");
}

/// Table mode: several sequences in one cache, each token its own sequence and position.
fn table_problem(
    rng: &mut impl Rng,
    heads: (usize, usize),
    dims: (usize, usize),
    rows: usize,
    window: usize,
    n_seq: usize,
    n_tok: usize,
) -> Problem {
    let paged = Paged::random(rng, n_seq, rows);
    let mut pr = Problem::new(rng, n_tok, heads, dims, rows, paged.pool_rows, window);
    pr.paged = Some(paged);
    let table = (0..n_tok)
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
    pr.table = Some(table);
    pr
}

#[test]
fn decode_position_table_attends_each_token_to_its_own_sequence() {
    let Some(ctx) = gpu_or_skip("decode_attention_position_table") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Attention::new(&ctx).unwrap().without_coop();
    let sg = ctx.caps().subgroup.size;
    // ((n_head, n_head_kv), (head_dim, head_dim_v), rows per sequence, window, sequences, tokens)
    let cases = [
        ((14, 2), (64, 64), 2000, 0, 4, 6),
        ((4, 1), (256, 256), 700, 64, 3, 5),
        ((8, 1), (64, 64), 100, 0, 5, 40), // a wide batch: one piece each
        ((6, 2), (38, 22), 40, 0, 4, 9),
        ((4, 4), (64, 64), 3000, 0, 2, 3),
    ];
    let mut worst = 0f32;
    // f16 caches (the serving engine's) on the cases of odd index, where the device has them;
    // q8_0 caches on the wide batch
    let f16 = KvType::F16.supported(ctx.caps());
    for (i, (heads, dims, rows, window, n_seq, n_tok)) in cases.into_iter().enumerate() {
        let sinks = i % 2 == 0;
        let kv = if i == 2 {
            KvType::Q8_0
        } else if f16 && i % 2 == 1 {
            KvType::F16
        } else {
            KvType::F32
        };
        let pr = table_problem(&mut rng, heads, dims, rows, window, n_seq, n_tok)
            .with_sinks(&mut rng, sinks)
            .with_kv(kv);
        let what = format!(
            "decode table {heads:?} heads {dims:?} dims, {n_seq} sequences of {rows}, \
             window {window}, {n_tok} tokens, sinks {sinks}, {kv} caches"
        );
        // the device's own layout, then many small pieces merged (each token its own count)
        let many = DecodePlan {
            wg: 128.max(sg),
            lpk: 2.min(sg),
            hb: 3.min((heads.0 / heads.1) as u32),
            kg: 2.min(sg),
            split: 13,
            min_chunk: 3,
        };
        for plan in [None, Some(many)] {
            match run(&ctx, &k, &pr, plan, &what) {
                Ok(e) => worst = worst.max(e),
                Err(e) => panic!("{e}, seed {seed}"),
            }
        }
    }
    println!("decode attention, position tables: max relative error {worst:.2e}");
}

/// A recorded chain replayed: the counters that elect the merging workgroup must be back at zero
/// after each run, or the next replay merges nothing (the output stays NaN) or too early.
#[test]
fn a_replayed_decode_chain_merges_every_time() {
    let Some(ctx) = gpu_or_skip("decode_attention_replay") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Attention::new(&ctx).unwrap().without_coop();
    let sg = ctx.caps().subgroup.size;
    let mut run_pr = Problem::new(&mut rng, 2, (14, 2), (64, 64), 1500, 1500, 0);
    run_pr.start = 1200;
    let table_pr =
        table_problem(&mut rng, (4, 1), (256, 256), 900, 0, 3, 4).with_sinks(&mut rng, true);
    for mut pr in [run_pr, table_pr] {
        let pr = &mut pr;
        let b = Bufs::new(&ctx, pr);
        let plan = DecodePlan {
            wg: 128.max(sg),
            lpk: 4.min(sg),
            hb: 2,
            kg: (128 / pr.s.head_dim_v.div_ceil(4) as u32).min(4).min(sg),
            split: 11,
            min_chunk: 16,
        };
        let mut chain = Chain::new(&ctx).unwrap();
        record(&mut chain, &k, pr, &b, Some(plan));
        // the device's own layout too, after a barrier (its own counters and partials)
        chain.barrier().unwrap();
        let b2 = Bufs::new(&ctx, pr);
        record(&mut chain, &k, pr, &b2, None);
        let n = pr.n_tok * pr.s.n_head * pr.s.head_dim_v;
        let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
        for replay in 0..3 {
            for out in [&b.out, &b2.out] {
                ctx.fill(out, 0, 4 * n as u64, f32::NAN.to_bits()).unwrap();
            }
            chain.run().unwrap();
            let got = (read(&ctx, &b.out, n), read(&ctx, &b2.out, n));
            match &first {
                None => {
                    let want = pr.want();
                    for g in [&got.0, &got.1] {
                        if let Err(e) = check_close(g, &want, REL) {
                            panic!("replay {replay}: {e}, seed {seed}");
                        }
                    }
                    first = Some(got);
                }
                Some(f) => {
                    let same = |a: &[f32], b: &[f32]| {
                        a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
                    };
                    assert!(
                        same(&f.0, &got.0) && same(&f.1, &got.1),
                        "replay {replay} differs from the first run, seed {seed}"
                    );
                }
            }
        }
        // new positions and queries, same chain: still right
        if pr.table.is_none() {
            pr.start = 733;
            pr.q = (0..pr.q.len()).map(|_| rng.gen_range(-2.0..2.0)).collect();
            ctx.upload(&b.pos, 0, &pr.pos_words()).unwrap();
            ctx.upload(&b.q, 0, &pr.q).unwrap();
            ctx.upload(&b2.pos, 0, &pr.pos_words()).unwrap();
            ctx.upload(&b2.q, 0, &pr.q).unwrap();
            chain.run().unwrap();
            let want = pr.want();
            for out in [&b.out, &b2.out] {
                if let Err(e) = check_close(&read(&ctx, out, n), &want, REL) {
                    panic!("replay at a new position: {e}, seed {seed}");
                }
            }
        }
    }
}

#[test]
fn the_decode_kernel_takes_decode_steps_and_bad_layouts_are_errors() {
    let Some(ctx) = gpu_or_skip("decode_attention_choice") else {
        return;
    };
    let b = poisoned(&ctx, "b", 1 << 16);
    let pb = with(&ctx, "pos", &[0u32; 64]);
    let mut args = AttentionArgs {
        kv: KvType::F32,
        q: &b.whole(),
        k: &b.whole(),
        v: &b.whole(),
        out: &b.whole(),
        n_tokens: DECODE_MAX_TOKENS,
        n_head: 14,
        n_head_kv: 2,
        head_dim: 64,
        head_dim_v: 64,
        n_kv_rows: 32,
        window: 0,
        scale: 0.125,
        pos: &pb.whole(),
        pos_offset: 0,
        positions: Positions::Run,
        sinks: None,
    };
    assert!(applies(&args));
    // whole GQA groups on a CPU; on a GPU cut into even chunks when there are few pairs
    let p = plan(ctx.caps(), &args);
    if ctx.caps().kind == octoflow_vk::DeviceKind::Cpu {
        assert_eq!(p.hb, 7);
    } else {
        assert_eq!(
            p.hb, 4,
            "16 (token, KV head) pairs: 2 chunks of the group of 7"
        );
        args.n_tokens = 1;
        assert_eq!(
            plan(ctx.caps(), &args).hb,
            1,
            "one token: one head per workgroup"
        );
    }
    args.n_tokens = DECODE_MAX_TOKENS + 1;
    assert!(!applies(&args), "prefill keeps attention.comp");
    args.positions = Positions::Table;
    assert!(applies(&args));
    // a short cache: one piece; a long one on a big device: pieces of at least a tile
    args.n_tokens = 1;
    args.positions = Positions::Run;
    assert_eq!(plan(ctx.caps(), &args).split, 1);
    args.n_kv_rows = 8192;
    let p = plan(ctx.caps(), &args);
    assert!(p.split > 1 && p.min_chunk >= p.wg / p.lpk, "{p:?}");
    if ctx.caps().kind != octoflow_vk::DeviceKind::Cpu {
        assert_eq!(
            p.hb, 7,
            "a long cache: whole groups, each K/V row read once"
        );
    }
    // a layout whose key groups exceed the subgroup (or the workgroup) is refused
    let k = Attention::new(&ctx).unwrap().without_coop();
    let mut chain = Chain::new(&ctx).unwrap();
    args.n_kv_rows = 32; // what `b` holds
    let bad = DecodePlan { kg: 256, ..p };
    let err = k
        .decode
        .record(&mut chain, &args, bad)
        .unwrap_err()
        .to_string();
    assert!(err.contains("decode layout"), "{err}");
}

/// One step of the fused kernel: (n_tokens, (n_head, n_head_kv), (head_dim, head_dim_v), n_rot,
/// options ("neox" pairs or normal, with "norm": per-head RMSNorm of q and k, "ff": frequency
/// factors, "yarn": YaRN-shaped frequencies and magnitude, "sinks": sink logits), cache rows,
/// window, start).
type FreshCase = (
    usize,
    (usize, usize),
    (usize, usize),
    usize,
    &'static str,
    usize,
    usize,
    usize,
);

/// Runs one fused step with `plan` (or the device's own through [`Attention::record_fresh`])
/// against the reference: per-head RMSNorm of q and k (when asked), `rope_store_ref` into the
/// caches, then `attention_ref`. The cache rows the step owns are poisoned (NaN) on the device
/// before the run: the kernel must take the step's keys from `k`, never from those rows.
fn run_fresh(
    ctx: &Context,
    att: &Attention,
    rng: &mut impl Rng,
    c: FreshCase,
    plan: Option<DecodePlan>,
    kv: KvType,
) -> std::result::Result<f32, String> {
    use crate::rms_norm::rms_norm_ref;
    use crate::rope::{test_freqs, RopeFreqs, RopeMode};
    use crate::rope_store::{rope_store_ref, run_rows, RopeStoreShape};
    let (n_tok, (n_head, n_kv), (hd, hv), n_rot, rope, rows, window, start) = c;
    let has = |w: &str| rope.split_whitespace().any(|x| x == w);
    let (neox, qk_norm, has_ff) = (has("neox"), has("norm"), has("ff"));
    let (yarn, has_sinks) = (has("yarn"), has("sinks"));
    let mut gen = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(lo..hi)).collect()
    };
    let (kw, vw) = (n_kv * hd, n_kv * hv);
    let q = gen(n_tok * n_head * hd, -2.0, 2.0);
    let k = gen(n_tok * kw, -2.0, 2.0);
    let v = gen(n_tok * vw, -2.0, 2.0);
    // the caches' old content as they hold it
    let mut kc = kv.decode(&kv.encode(&gen(rows * kw, -2.0, 2.0)));
    let mut vc = kv.decode(&kv.encode(&gen(rows * vw, -2.0, 2.0)));
    let qn = gen(hd, 0.5, 1.5);
    let kn = gen(hd, 0.5, 1.5);
    let ff = gen(n_rot / 2, 1.0, 4.0);
    let sinks = gen(n_head, -2.0, 4.0);
    let eps = 1e-6;
    let mode = if neox {
        RopeMode::Neox
    } else {
        RopeMode::Normal
    };
    let (base, scale) = (10000.0, if has_ff { 1.0 } else { 0.5 });
    let ff = has_ff.then_some(ff.as_slice());
    let (freqs, mscale) = test_freqs(rng, n_rot, base, scale, ff, yarn);

    // the device: caches with the step's rows poisoned
    let stored: Vec<usize> = (start..start + n_tok).filter(|&r| r < rows).collect();
    let (mut kc_dev, mut vc_dev) = (kc.clone(), vc.clone());
    for &r in &stored {
        kc_dev[r * kw..(r + 1) * kw].fill(f32::NAN);
        vc_dev[r * vw..(r + 1) * vw].fill(f32::NAN);
    }
    let s = AttentionShape {
        n_head,
        n_head_kv: n_kv,
        head_dim: hd,
        head_dim_v: hv,
        n_kv_rows: rows,
        window,
        scale: 1.0 / (hd as f32).sqrt(),
        sinks: has_sinks.then_some(sinks.as_slice()),
    };
    let bq = with(ctx, "q", &q);
    let bk = with(ctx, "k", &k);
    let bv = with(ctx, "v", &v);
    let bkc = with(ctx, "kc", &kv.encode(&kc_dev));
    let bvc = with(ctx, "vc", &kv.encode(&vc_dev));
    let bqn = with(ctx, "qn", &qn);
    let bkn = with(ctx, "kn", &kn);
    let table = RopeFreqs::upload(ctx, "rope_freqs", &freqs, mscale).unwrap();
    let bs = with(ctx, "sinks", &sinks);
    let sinks_w = bs.whole();
    let out = poisoned(ctx, "out", n_tok * n_head * hv);
    let pos = with(ctx, "pos", &[7u32, start as u32]);
    let args = AttentionArgs {
        q: &bq.whole(),
        k: &bkc.whole(),
        v: &bvc.whole(),
        out: &out.whole(),
        n_tokens: n_tok as u32,
        n_head: n_head as u32,
        n_head_kv: n_kv as u32,
        head_dim: hd as u32,
        head_dim_v: hv as u32,
        n_kv_rows: rows as u32,
        window: window as u32,
        scale: s.scale,
        pos: &pos.whole(),
        pos_offset: 1,
        positions: Positions::Run,
        kv,
        sinks: has_sinks.then_some(&sinks_w),
    };
    let (qnw, knw) = (bqn.whole(), bkn.whole());
    let f = FreshKv {
        k: &bk.whole(),
        v: &bv.whole(),
        n_ctx: rows as u32,
        mode,
        freqs: &table,
        qk_norm: qk_norm.then_some((&qnw, &knw, eps)),
    };
    let mut chain = Chain::new(ctx).unwrap();
    match plan {
        Some(p) => att.decode.record_fresh(&mut chain, &args, &f, p).unwrap(),
        None => att.record_fresh(&mut chain, &args, &f).unwrap(),
    }
    assert_eq!(chain.dispatch_count(), 1, "one dispatch");
    chain.run().unwrap();

    // the reference
    let (mut q_ref, mut k_ref) = (q.clone(), k.clone());
    if qk_norm {
        rms_norm_ref(&q, &qn, &mut q_ref, hd, eps);
        rms_norm_ref(&k, &kn, &mut k_ref, hd, eps);
    }
    let shape = RopeStoreShape {
        n_head,
        n_head_kv: n_kv,
        head_dim: hd,
        head_dim_v: hv,
        mode,
        kv,
    };
    let run = run_rows(start, n_tok);
    // the stored rows unrounded (q8_0 caches are held to them: check_q8)
    let (mut exact_kc, mut exact_vc) = (kc.clone(), vc.clone());
    let exact = RopeStoreShape {
        kv: KvType::F32,
        ..shape
    };
    rope_store_ref(
        &mut q_ref.clone(),
        &k_ref,
        &v,
        &mut exact_kc,
        &mut exact_vc,
        &exact,
        &freqs,
        mscale,
        &run,
    );
    rope_store_ref(
        &mut q_ref, &k_ref, &v, &mut kc, &mut vc, &shape, &freqs, mscale, &run,
    );
    let what = format!("fresh case {c:?}, plan {plan:?}, {kv} caches");
    let read_kv = |b: &Buffer, n: usize| {
        let mut bytes = vec![0u8; kv.bytes_for(n as u64) as usize];
        ctx.download(b, 0, &mut bytes).unwrap();
        kv.decode(&bytes)
    };
    let got_kc = read_kv(&bkc, kc.len());
    let got_vc = read_kv(&bvc, vc.len());
    match kv {
        KvType::Q8_0 => {
            let rows_of = |x: &[f32], w: usize, stored_rows: bool| -> Vec<f32> {
                (0..rows)
                    .filter(|r| stored.contains(r) == stored_rows)
                    .flat_map(|r| x[r * w..(r + 1) * w].iter().copied())
                    .collect()
            };
            check_q8(
                &rows_of(&got_kc, kw, true),
                &rows_of(&exact_kc, kw, true),
                REL,
            )
            .map_err(|e| format!("{what}: k cache: {e}"))?;
            check_q8(
                &rows_of(&got_vc, vw, true),
                &rows_of(&exact_vc, vw, true),
                0.0,
            )
            .map_err(|e| format!("{what}: v cache: {e}"))?;
            // the other rows keep their content, bit for bit
            let same = |a: Vec<f32>, b: Vec<f32>| {
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits())
            };
            if !same(rows_of(&got_kc, kw, false), rows_of(&kc, kw, false))
                || !same(rows_of(&got_vc, vw, false), rows_of(&vc, vw, false))
            {
                return Err(format!("{what}: a cache row the step does not own changed"));
            }
        }
        _ => {
            let (rel_k, rel_v) = match kv {
                KvType::F32 => (REL, 0.0),
                _ => (REL_F16, REL_F16),
            };
            check_close(&got_kc, &kc, rel_k).map_err(|e| format!("{what}: k cache: {e}"))?;
            check_close(&got_vc, &vc, rel_v).map_err(|e| format!("{what}: v cache: {e}"))?;
        }
    }
    // with rounding caches the step must attend to exactly the keys and values it stored (what
    // later steps read back), so the output is held to the reference over the stored caches
    let (kc, vc) = match kv {
        KvType::F32 => (kc, vc),
        KvType::F16 | KvType::Q8_0 => (got_kc, got_vc),
    };
    let mut want = vec![0f32; n_tok * n_head * hv];
    attention_ref(&s, &q_ref, &kc, &vc, start, &mut want);
    let got = read(ctx, &out, want.len());
    check_close(&got, &want, REL).map_err(|e| format!("{what}: out: {e}"))?;
    Ok(max_rel(&got, &want))
}

#[test]
fn fused_decode_attention_matches_norm_rope_store_then_attention() {
    let Some(ctx) = gpu_or_skip("fused_decode_attention") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let att = Attention::new(&ctx).unwrap().without_coop();
    let sg = ctx.caps().subgroup.size;
    let cases: [FreshCase; 16] = [
        // qwen2.5 (neox, full rotation) at positions 0, 6, 599, 30000 (angles of ~3e4 rad)
        (1, (14, 2), (64, 64), 64, "neox", 1024, 0, 0),
        (1, (4, 1), (64, 64), 64, "neox", 32768, 0, 30000),
        (1, (14, 2), (64, 64), 64, "neox", 1024, 0, 6),
        (1, (14, 2), (64, 64), 64, "neox", 1024, 0, 599),
        // gemma3: head norms, head_dim 256, sliding window
        (1, (4, 1), (256, 256), 256, "neox norm", 2048, 512, 1500),
        (1, (4, 1), (256, 256), 256, "neox norm", 2048, 0, 3),
        // llama (normal pairs), partial rotation, frequency factors
        (1, (9, 3), (64, 64), 64, "normal", 300, 0, 200),
        (1, (8, 2), (64, 64), 32, "normal ff", 300, 0, 250),
        (1, (8, 2), (128, 96), 96, "neox norm ff", 400, 0, 333),
        // several tokens of one run: each sees the step's earlier keys
        (4, (14, 2), (64, 64), 64, "neox", 1024, 0, 597),
        (8, (8, 1), (256, 256), 128, "normal norm", 700, 100, 650),
        // odd widths; the last tokens past the cache end (not stored, not seen)
        (3, (6, 2), (38, 22), 20, "neox norm", 60, 0, 30),
        (5, (9, 3), (64, 64), 64, "normal", 200, 0, 197),
        // gpt-oss: YaRN angles, sinks, windowed and full layers
        (1, (8, 2), (64, 64), 64, "neox yarn sinks", 300, 128, 250),
        (1, (8, 2), (64, 64), 64, "neox yarn sinks", 32768, 0, 30000),
        (3, (8, 1), (64, 64), 64, "neox yarn sinks", 100, 0, 5),
    ];
    let many = DecodePlan {
        wg: 128.max(sg),
        lpk: 2.min(sg),
        hb: 1,
        kg: 2.min(sg),
        split: 13,
        min_chunk: 3,
    };
    let mut worst = 0f32;
    // f16 caches (the product's default) on every other case with the device's own layout,
    // where it has them
    let f16 = KvType::F16.supported(ctx.caps());
    for (i, c) in cases.into_iter().enumerate() {
        // f16 caches in the device's layout on even cases, in the many-pieces layout on every
        // fourth (a GPU's keys split over many workgroups, which lavapipe's own layout never
        // uses)
        let f16_plan = match i % 4 {
            0 | 2 => Some(None),
            1 => Some(Some(many)),
            _ => None,
        };
        let f16_run = f16_plan.filter(|_| f16).map(|p| (p, KvType::F16));
        // q8_0 caches on every third case with whole blocks, the device's layout and many
        // pieces in turn
        let (_, _, (hd, hv), ..) = c;
        let q8_run = (i % 3 == 2 && hd % 32 == 0 && hv % 32 == 0)
            .then_some((if i % 2 == 0 { None } else { Some(many) }, KvType::Q8_0));
        for (plan, kv) in [(None, KvType::F32), (Some(many), KvType::F32)]
            .into_iter()
            .chain(f16_run)
            .chain(q8_run)
        {
            match run_fresh(&ctx, &att, &mut rng, c, plan, kv) {
                Ok(e) => worst = worst.max(e),
                Err(e) => panic!("{e}, seed {seed}"),
            }
        }
    }
    println!("fused decode attention: max relative error {worst:.2e}");
}

// Timing of these shapes (benchmarks, with the `bench` feature).
#[cfg(feature = "bench")]
#[path = "../../benches/attention_decode_bench.rs"]
mod bench;
