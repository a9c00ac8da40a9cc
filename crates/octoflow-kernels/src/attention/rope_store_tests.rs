//! Device tests of `rope_store.rs`.

use octoflow_vk::testing::gpu_or_skip;
use rand::Rng;

use super::*;
use crate::check_close;
use crate::kv_type::check_q8;
use crate::rope::test_freqs;
use crate::testkit::{read, with};
use crate::{page_row, KernelError, KvType, KV_PAGE};
use octoflow_vk::Buffer;
use rand::seq::SliceRandom;

/// The rotation is rope.comp's (same angle code, rope.glsl): 1e-4 relative with check_close's 1%
/// floor near zero, as in rope.rs's test (measured a few 1e-6 on lavapipe). Copies are exact.
const REL: f32 = 1e-4;
/// f16 caches: the stored value is the f32 result rounded once, so the reference's rounding of
/// its own f32 result may land one f16 step (2^-11 relative) away where the two f32 values sit
/// on either side of a rounding boundary: 1e-3.
const REL_F16: f32 = 1e-3;

/// One test case.
#[derive(Debug, Clone, Copy)]
struct Case {
    n: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    head_dim_v: usize,
    n_rot: usize,
    mode: RopeMode,
    base: f32,
    scale: f32,
    ff: bool,
    /// YaRN-shaped frequencies and a magnitude factor (see `test_freqs`).
    yarn: bool,
    /// Table mode over two sequences of shuffled blocks (n_ctx a multiple of 32), else a run
    /// from `start`.
    table: bool,
    start: usize,
    n_ctx: usize,
    /// What the caches hold.
    kv: KvType,
}

/// The largest `|got - want| / max(|want|, 0.01 max|want|)` (check_close's measure).
fn max_rel(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(0.01 * scale).max(f32::MIN_POSITIVE))
        .fold(0f32, f32::max)
}

/// Rows `rows` (of `width`) of `x`, concatenated.
fn gather(x: &[f32], width: usize, rows: &[usize]) -> Vec<f32> {
    rows.iter()
        .flat_map(|&r| x[r * width..(r + 1) * width].iter().copied())
        .collect()
}

/// Runs one case on fresh random inputs; returns the largest relative error of q and of the
/// K cache, or the mismatch.
fn run_case(
    ctx: &Context,
    kern: &RopeStore,
    rng: &mut impl Rng,
    c: Case,
) -> std::result::Result<(f32, f32), String> {
    let (n, hd) = (c.n, c.head_dim);
    let (qw, kw, vw) = (c.n_head * hd, c.n_head_kv * hd, c.n_head_kv * c.head_dim_v);
    let q: Vec<f32> = (0..n * qw).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let k: Vec<f32> = (0..n * kw).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let v: Vec<f32> = (0..n * vw).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let ff: Vec<f32> = (0..c.n_rot / 2).map(|_| rng.gen_range(1.0..40.0)).collect();
    let ff = c.ff.then_some(&ff[..]);
    let (freqs, mscale) = test_freqs(rng, c.n_rot, c.base, c.scale, ff, c.yarn);

    // (position, cache row) per token, and the u32 words of `pos` from offset 3
    let mut words = vec![rng.gen(), rng.gen(), rng.gen()];
    let rows: Vec<(usize, usize)> = if c.table {
        // two sequences of shuffled blocks over the cache's blocks, and a third whose block
        // lies past the end of the cache
        let page = KV_PAGE as usize;
        let n_blocks = c.n_ctx / page;
        let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
        ids.shuffle(rng);
        let half = n_blocks / 2;
        let tables = [
            ids[..half].to_vec(),
            ids[half..].to_vec(),
            vec![n_blocks as u32 + 1],
        ];
        let per_seq = half * page;
        let mut seqs: Vec<(usize, usize)> = Vec::new(); // (position, sequence)
        while seqs.len() < n {
            let seq = rng.gen_range(0..2);
            let p = rng.gen_range(0..per_seq);
            if !seqs.contains(&(p, seq)) {
                seqs.push((p, seq));
            }
        }
        if n > 4 {
            seqs[n - 1] = (3, 2); // not stored
        }
        let first = words.len();
        words.resize(first + 2 * n, 0);
        let mut at = Vec::new();
        for t in &tables {
            at.push(words.len() as u32);
            words.extend(t);
        }
        for (i, &(p, seq)) in seqs.iter().enumerate() {
            words[first + 2 * i] = p as u32;
            words[first + 2 * i + 1] = at[seq];
        }
        seqs.iter()
            .map(|&(p, seq)| {
                let row = page_row(&tables[seq], p).unwrap_or(usize::MAX);
                (p, row.min(c.n_ctx + 2))
            })
            .collect()
    } else {
        words.push(c.start as u32);
        run_rows(c.start, n)
    };
    let stored: Vec<usize> = rows
        .iter()
        .map(|&(_, r)| r)
        .filter(|&r| r < c.n_ctx)
        .collect();

    // caches: random old content, NaN in the rows this call stores
    let mut kc: Vec<f32> = (0..c.n_ctx * kw).map(|_| rng.gen()).collect();
    let mut vc: Vec<f32> = (0..c.n_ctx * vw).map(|_| rng.gen()).collect();
    for &r in &stored {
        kc[r * kw..(r + 1) * kw].fill(f32::NAN);
        vc[r * vw..(r + 1) * vw].fill(f32::NAN);
    }
    let (qb, kb, vb) = (with(ctx, "q", &q), with(ctx, "k", &k), with(ctx, "v", &v));
    // the old content as the caches hold it (NaN stays NaN in f16)
    let (kc, vc) = (
        c.kv.decode(&c.kv.encode(&kc)),
        c.kv.decode(&c.kv.encode(&vc)),
    );
    let kcb = with(ctx, "k_cache", &c.kv.encode(&kc));
    let vcb = with(ctx, "v_cache", &c.kv.encode(&vc));
    let pb = with(ctx, "pos", &words);
    let table = RopeFreqs::upload(ctx, "rope_freqs", &freqs, mscale).unwrap();
    let args = RopeStoreArgs {
        q: &qb.whole(),
        k: &kb.whole(),
        v: &vb.whole(),
        k_cache: &kcb.whole(),
        v_cache: &vcb.whole(),
        n_ctx: c.n_ctx as u32,
        n_tokens: n as u32,
        n_head: c.n_head as u32,
        n_head_kv: c.n_head_kv as u32,
        head_dim: hd as u32,
        head_dim_v: c.head_dim_v as u32,
        mode: c.mode,
        freqs: &table,
        pos: &pb.whole(),
        pos_offset: 3,
        kv: c.kv,
        positions: if c.table {
            Positions::Table
        } else {
            Positions::Run
        },
    };
    let mut chain = Chain::new(ctx).unwrap();
    kern.record(&mut chain, &args).unwrap();
    chain.run().unwrap();

    let shape = RopeStoreShape {
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim: hd,
        head_dim_v: c.head_dim_v,
        mode: c.mode,
        kv: c.kv,
    };
    let (mut want_q, mut want_kc, mut want_vc) = (q.clone(), kc.clone(), vc.clone());
    rope_store_ref(
        &mut want_q,
        &k,
        &v,
        &mut want_kc,
        &mut want_vc,
        &shape,
        &freqs,
        mscale,
        &rows,
    );
    // q8_0: the exact values the stored ones are held to (see check_q8)
    let (mut exact_kc, mut exact_vc) = (kc.clone(), vc.clone());
    rope_store_ref(
        &mut q.clone(),
        &k,
        &v,
        &mut exact_kc,
        &mut exact_vc,
        &RopeStoreShape {
            kv: KvType::F32,
            ..shape
        },
        &freqs,
        mscale,
        &rows,
    );
    let got_q = read(ctx, &qb, q.len());
    let read_kv = |b: &Buffer, n: usize| {
        let mut bytes = vec![0u8; c.kv.bytes_for(n as u64) as usize];
        ctx.download(b, 0, &mut bytes).unwrap();
        c.kv.decode(&bytes)
    };
    let got_kc = read_kv(&kcb, kc.len());
    let got_vc = read_kv(&vcb, vc.len());
    let (rel_k, rel_v) = match c.kv {
        KvType::F32 => (REL, 0.0),
        KvType::F16 => (REL_F16, REL_F16),
        KvType::Q8_0 => (REL, 0.0),
    };

    check_close(&got_q, &want_q, REL).map_err(|e| format!("q: {e}"))?;
    let (gk, wk) = (gather(&got_kc, kw, &stored), gather(&want_kc, kw, &stored));
    let (gv, wv) = (gather(&got_vc, vw, &stored), gather(&want_vc, vw, &stored));
    if c.kv == KvType::Q8_0 {
        let (xk, xv) = (
            gather(&exact_kc, kw, &stored),
            gather(&exact_vc, vw, &stored),
        );
        check_q8(&gk, &xk, rel_k).map_err(|e| format!("k cache rows {stored:?}: {e}"))?;
        check_q8(&gv, &xv, rel_v).map_err(|e| format!("v cache rows {stored:?}: {e}"))?;
    } else {
        check_close(&gk, &wk, rel_k).map_err(|e| format!("k cache rows {stored:?}: {e}"))?;
        check_close(&gv, &wv, rel_v).map_err(|e| format!("v cache rows {stored:?}: {e}"))?;
    }
    // the other rows keep their old content, bit for bit
    for r in (0..c.n_ctx).filter(|r| !stored.contains(r)) {
        let same = |got: &[f32], old: &[f32], w: usize| {
            got[r * w..(r + 1) * w]
                .iter()
                .zip(&old[r * w..(r + 1) * w])
                .all(|(g, o)| g.to_bits() == o.to_bits())
        };
        if !same(&got_kc, &kc, kw) || !same(&got_vc, &vc, vw) {
            return Err(format!("untouched cache row {r} changed"));
        }
    }
    // dims past n_rot pass through bit for bit (k rounded as the cache holds it): q in place,
    // k into its cache row
    for (i, (g, x)) in got_q.iter().zip(&q).enumerate() {
        if i % hd >= c.n_rot && g.to_bits() != x.to_bits() {
            return Err(format!("q element {i} (dim {}) changed", i % hd));
        }
    }
    // (q8_0 rounds whole blocks, rotated dims with the others: check_q8 above)
    let per_value = c.kv != KvType::Q8_0;
    for (t, &(_, r)) in rows
        .iter()
        .enumerate()
        .filter(|(_, &(_, r))| per_value && r < c.n_ctx)
    {
        for d in 0..kw {
            let (g, x) = (got_kc[r * kw + d], c.kv.round(&[k[t * kw + d]])[0]);
            if d % hd >= c.n_rot && g.to_bits() != x.to_bits() {
                return Err(format!("k dim {} of token {t} changed", d % hd));
            }
        }
    }
    // k itself is left as it was (documented)
    let got_k = read(ctx, &kb, k.len());
    if got_k
        .iter()
        .zip(&k)
        .any(|(g, x)| g.to_bits() != x.to_bits())
    {
        return Err("k was modified".into());
    }
    Ok((max_rel(&got_q, &want_q), max_rel(&gk, &wk)))
}

#[test]
fn gpu_rope_store_matches_rope_then_set_rows_on_random_inputs() {
    let Some(ctx) = gpu_or_skip("gpu_rope_store_matches_the_reference") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let kern = RopeStore::new(&ctx).unwrap();
    let base = Case {
        n: 1,
        n_head: 8,
        n_head_kv: 2,
        head_dim: 64,
        head_dim_v: 64,
        n_rot: 64,
        mode: RopeMode::Normal,
        base: 10_000.0,
        scale: 1.0,
        ff: false,
        yarn: false,
        table: false,
        start: 17,
        n_ctx: 40,
        kv: KvType::F32,
    };
    let cases = [
        // llama-like decode step
        base,
        // partial rotation, freq factors, two sequences
        Case {
            n: 3,
            n_head: 4,
            n_head_kv: 4,
            n_rot: 32,
            mode: RopeMode::Neox,
            ff: true,
            table: true,
            n_ctx: 64,
            ..base
        },
        // gemma3-like: head_dim 256, one kv head, scaled positions
        Case {
            n: 17,
            n_head: 4,
            n_head_kv: 1,
            head_dim: 256,
            head_dim_v: 256,
            n_rot: 256,
            mode: RopeMode::Neox,
            base: 1_000_000.0,
            scale: 0.125,
            start: 5,
            n_ctx: 48,
            ..base
        },
        // head_dim 256 with n_rot 128, other value width, table (last token past the end)
        Case {
            n: 17,
            n_head: 2,
            n_head_kv: 2,
            head_dim: 256,
            head_dim_v: 128,
            n_rot: 128,
            ff: true,
            table: true,
            n_ctx: 48,
            ..base
        },
        // a run that goes past the end of the cache (YaRN angles)
        Case {
            n: 3,
            yarn: true,
            head_dim: 128,
            head_dim_v: 128,
            n_rot: 64,
            ff: true,
            start: 2,
            n_ctx: 4,
            ..base
        },
        // large positions, YaRN (gpt-oss's NeoX rotation of 64 dims)
        Case {
            n: 17,
            yarn: true,
            n_head: 2,
            n_head_kv: 1,
            mode: RopeMode::Neox,
            base: 1_000_000.0,
            start: 32_760,
            n_ctx: 32_800,
            ..base
        },
        Case {
            n: 1,
            n_rot: 48,
            yarn: true,
            mode: RopeMode::Neox,
            ff: true,
            table: true,
            n_ctx: 32,
            ..base
        },
        Case {
            n: 3,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 256,
            head_dim_v: 256,
            n_rot: 256,
            table: true,
            n_ctx: 48,
            ..base
        },
    ];
    let (mut worst_q, mut worst_k) = (0f32, 0f32);
    // every case with f32 caches, then with f16 ones where the device has 16-bit storage, then
    // with q8_0 ones
    let f16 = KvType::F16.supported(ctx.caps());
    let with_f16 = cases.iter().filter(|_| f16).map(|&c| Case {
        kv: KvType::F16,
        ..c
    });
    let with_q8 = cases.iter().map(|&c| Case {
        kv: KvType::Q8_0,
        ..c
    });
    for c in cases
        .into_iter()
        .chain(with_f16.collect::<Vec<_>>())
        .chain(with_q8)
    {
        match run_case(&ctx, &kern, &mut rng, c) {
            Ok((eq, ek)) => {
                println!("{c:?}: max relative error q {eq:.2e}, k cache {ek:.2e}");
                worst_q = worst_q.max(eq);
                worst_k = worst_k.max(ek);
            }
            Err(e) => panic!("rope_store {c:?}, seed {seed}: {e}"),
        }
    }
    println!("rope_store worst relative error: q {worst_q:.2e}, k cache {worst_k:.2e}");
}

#[test]
fn bad_shapes_and_overlaps_are_shape_errors() {
    let Some(ctx) = gpu_or_skip("rope_store_shape_errors") else {
        return;
    };
    let q = with(&ctx, "q", &[0f32; 128]);
    let k = with(&ctx, "k", &[0f32; 64]);
    let v = with(&ctx, "v", &[0f32; 64]);
    let kc = with(&ctx, "kc", &[0f32; 256]);
    let vc = with(&ctx, "vc", &[0f32; 256]);
    let p = with(&ctx, "ctl", &[0u32; 2]);
    let table = RopeFreqs::upload(&ctx, "rope_freqs", &[0.5; 32], 1.0).unwrap();
    let mut short = table.clone();
    short.table = table.table.buffer.slice(0, 16).unwrap();
    let (odd, wide) = (
        RopeFreqs {
            n_rot: 31,
            ..table.clone()
        },
        RopeFreqs::upload(&ctx, "rope_freqs", &[0.5; 33], 1.0).unwrap(),
    );
    let kern = RopeStore::new(&ctx).unwrap();
    let mut chain = Chain::new(&ctx).unwrap();
    let (qs, ks, vs, kcs, vcs, ps) = (
        q.whole(),
        k.whole(),
        v.whole(),
        kc.whole(),
        vc.whole(),
        p.whole(),
    );
    let good = RopeStoreArgs {
        q: &qs,
        k: &ks,
        v: &vs,
        k_cache: &kcs,
        v_cache: &vcs,
        n_ctx: 4,
        n_tokens: 1,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 64,
        head_dim_v: 64,
        mode: RopeMode::Normal,
        freqs: &table,
        pos: &ps,
        pos_offset: 1,
        positions: Positions::Run,
        kv: KvType::F32,
    };
    kern.record(&mut chain, &good).unwrap();
    let mut err = |a: &RopeStoreArgs| match kern.record(&mut chain, a) {
        Err(KernelError::Shape { detail, .. }) => detail,
        other => panic!("expected a shape error, got {other:?}"),
    };
    let e = err(&RopeStoreArgs {
        freqs: &odd,
        ..good
    });
    assert!(e.contains("n_rot 31"), "{e}");
    let e = err(&RopeStoreArgs {
        freqs: &wide,
        ..good
    });
    assert!(e.contains("n_rot 66"), "{e}");
    let e = err(&RopeStoreArgs {
        n_tokens: 0,
        ..good
    });
    assert!(e.contains("empty"), "{e}");
    let e = err(&RopeStoreArgs { n_ctx: 5, ..good });
    assert!(e.contains("k_cache") && e.contains("kc"), "{e}");
    let e = err(&RopeStoreArgs {
        n_tokens: 2,
        ..good
    });
    assert!(e.contains("q ("), "{e}");
    let e = err(&RopeStoreArgs {
        head_dim_v: 128,
        ..good
    });
    assert!(e.contains("v ("), "{e}");
    let e = err(&RopeStoreArgs {
        positions: Positions::Table,
        ..good
    });
    assert!(e.contains("pos") && e.contains("ctl"), "{e}");
    let e = err(&RopeStoreArgs {
        freqs: &short,
        ..good
    });
    assert!(e.contains("freqs") && e.contains("rope_freqs"), "{e}");
    // written operands must not overlap the others
    let e = err(&RopeStoreArgs {
        k_cache: &qs,
        n_ctx: 2,
        ..good
    });
    assert!(e.contains("overlaps"), "{e}");
    let head = kc.slice(0, 512).unwrap();
    let tail = kc.slice(512, 512).unwrap();
    let e = err(&RopeStoreArgs {
        v_cache: &head,
        n_ctx: 2,
        ..good
    });
    assert!(e.contains("k_cache overlaps v_cache"), "{e}");
    // disjoint pieces of one buffer are fine
    let vc_small = RopeStoreArgs {
        k_cache: &head,
        v_cache: &tail,
        n_ctx: 2,
        ..good
    };
    kern.record(&mut chain, &vc_small).unwrap();
    // f16 caches: the same bytes hold twice the rows
    if KvType::F16.supported(ctx.caps()) {
        let f16 = |n_ctx| RopeStoreArgs {
            n_ctx,
            kv: KvType::F16,
            ..good
        };
        kern.record(&mut chain, &f16(8)).unwrap();
        let e = match kern.record(&mut chain, &f16(9)) {
            Err(KernelError::Shape { detail, .. }) => detail,
            other => panic!("expected a shape error, got {other:?}"),
        };
        assert!(e.contains("k_cache") && e.contains("f16 values"), "{e}");
    }
    // q8_0 caches: 36 bytes per block of 32 values (1,024 bytes hold 14 rows of 64), and heads
    // of whole blocks only
    let q8 = |n_ctx| RopeStoreArgs {
        n_ctx,
        kv: KvType::Q8_0,
        ..good
    };
    kern.record(&mut chain, &q8(14)).unwrap();
    let mut err = |a: &RopeStoreArgs| match kern.record(&mut chain, a) {
        Err(KernelError::Shape { detail, .. }) => detail,
        other => panic!("expected a shape error, got {other:?}"),
    };
    let e = err(&q8(15));
    assert!(e.contains("k_cache") && e.contains("q8_0 values"), "{e}");
    let narrow = RopeFreqs::upload(&ctx, "rope_freqs", &[0.5; 16], 1.0).unwrap();
    let e = err(&RopeStoreArgs {
        head_dim: 48,
        freqs: &narrow,
        ..q8(4)
    });
    assert!(e.contains("multiple of 32") && e.contains("48"), "{e}");
}
