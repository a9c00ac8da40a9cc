//! Device and reference tests of `lora.rs`.

use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::check_close;
use crate::testkit::{poisoned, random, read, with};

/// The GPU sums n_in (<= 1030 here) products in f32 per rank row (per-invocation strided partial
/// sums, then a subgroup/shared-memory tree), scales once, then sums <= 256 products per output
/// and adds y once; the reference sums in f64. Inputs are in [-1, 1]: a shrink sum is ~√n_in/3
/// with rounding error ~2^-24·√n_in·(its size) ≈ 2e-6 relative, and the expand sum likewise over
/// r_total terms, so the worst of thousands of outputs is ~1e-5 relative to check_close's floor
/// (1% of max|y|). 1e-4 leaves ~6x margin (measured up to 1.7e-5 on lavapipe) while any
/// indexing or skipping error (O(1) wrong) fails.
const REL: f32 = 1e-4;

/// One test configuration.
struct Case {
    ranks: Vec<u32>,
    n_in: usize,
    n_out: usize,
    n_tokens: usize,
    x_stride: usize,
    y_stride: usize,
    y_col: usize,
    mix_offset: usize,
    mix_stride: usize,
    /// Per mix, per adapter: whether the adapter is on (a random nonzero scale) or off (0).
    on: Vec<Vec<bool>>,
    /// Adapters whose A rows and B columns are NaN (must be off in every mix).
    nan: Vec<usize>,
}

/// check_close's error measure: the worst `|got - want| / max(|want|, 0.01 max|want|)`.
fn worst_rel(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(0.01 * scale).max(f32::MIN_POSITIVE))
        .fold(0f32, f32::max)
}

/// Runs shrink, compute barrier, expand on the device and checks y (against `lora_ref`, and
/// bitwise outside the written columns) and t (finite, exactly 0 where the scale is 0).
/// Returns the measured relative error of y.
fn run_case(ctx: &Context, k: &Lora, rng: &mut StdRng, seed: u64, c: &Case) -> f32 {
    let what = format!(
        "ranks {:?} n_in {} n_out {} tokens {} mix stride {} (seed {seed})",
        c.ranks, c.n_in, c.n_out, c.n_tokens, c.mix_stride
    );
    let n_adapters = c.ranks.len();
    let mut offsets = vec![0u32];
    for r in &c.ranks {
        offsets.push(offsets.last().unwrap() + r);
    }
    let r_total = *offsets.last().unwrap() as usize;
    let n_mix = c.on.len();
    let mut a = random(rng, r_total * c.n_in);
    let mut b = random(rng, c.n_out * r_total);
    for &ad in &c.nan {
        let (lo, hi) = (offsets[ad] as usize, offsets[ad + 1] as usize);
        a[lo * c.n_in..hi * c.n_in].fill(f32::NAN);
        for j in 0..c.n_out {
            b[j * r_total + lo..j * r_total + hi].fill(f32::NAN);
        }
    }
    let scales: Vec<f32> =
        c.on.iter()
            .flatten()
            .map(|&on| {
                if on {
                    rng.gen_range(0.25f32..2.0) * if rng.gen() { 1.0 } else { -1.0 }
                } else {
                    0.0
                }
            })
            .collect();
    // Unused mix entries hold an id far out of range: reading one would show.
    let mix_len = c.mix_offset + (c.n_tokens - 1) * c.mix_stride + 1;
    let mut mix = vec![12_345u32; mix_len];
    // Tokens cycle through the mixes; a broadcast mix (stride 0) is the last one.
    let start = rng.gen_range(0..n_mix);
    for t in 0..c.n_tokens {
        mix[c.mix_offset + t * c.mix_stride] = ((start + t) % n_mix) as u32;
    }
    if c.mix_stride == 0 {
        mix[c.mix_offset] = (n_mix - 1) as u32;
    }
    let x = random(rng, c.n_tokens * c.x_stride);
    let y0: Vec<f32> = random(rng, c.n_tokens * c.y_stride);

    let (ab, bb, ob) = (
        with(ctx, "lora_a", &a),
        with(ctx, "lora_b", &b),
        with(ctx, "offsets", &offsets),
    );
    let (sb, mb, xb, yb) = (
        with(ctx, "scales", &scales),
        with(ctx, "mix", &mix),
        with(ctx, "x", &x),
        with(ctx, "y", &y0),
    );
    let tb = poisoned(ctx, "t", c.n_tokens * r_total);
    let (a_s, b_s, o_s, s_s, m_s) = (ab.whole(), bb.whole(), ob.whole(), sb.whole(), mb.whole());
    let stack = LoraStack {
        a: &a_s,
        b: &b_s,
        offsets: &o_s,
        n_adapters: n_adapters as u32,
        r_total: r_total as u32,
        n_in: c.n_in as u32,
        n_out: c.n_out as u32,
    };
    let lm = LoraMix {
        scales: &s_s,
        n_mix: n_mix as u32,
        mix: &m_s,
        mix_offset: c.mix_offset as u32,
        mix_stride: c.mix_stride as u32,
    };
    let n_tokens = c.n_tokens as u32;
    let mut chain = Chain::new(ctx).unwrap();
    k.record_shrink(
        &mut chain,
        &stack,
        &lm,
        &xb.whole(),
        c.x_stride as u32,
        &tb.whole(),
        n_tokens,
    )
    .unwrap();
    chain.compute_barrier().unwrap();
    k.record_expand(
        &mut chain,
        &stack,
        &lm,
        &tb.whole(),
        &yb.whole(),
        c.y_stride as u32,
        c.y_col as u32,
        n_tokens,
    )
    .unwrap();
    chain.run().unwrap();
    assert_no_validation_errors(ctx);

    let mut want = y0.clone();
    lora_ref(
        &a,
        &b,
        &offsets,
        c.n_in,
        c.n_out,
        &scales,
        n_mix,
        &mix,
        c.mix_offset,
        c.mix_stride,
        &x,
        c.x_stride,
        &mut want,
        c.y_stride,
        c.y_col,
        c.n_tokens,
    )
    .unwrap();
    let got = read(ctx, &yb, y0.len());
    for (i, (g, y)) in got.iter().zip(&y0).enumerate() {
        let col = i % c.y_stride;
        if (col < c.y_col || col >= c.y_col + c.n_out) && g.to_bits() != y.to_bits() {
            panic!("{what}: untouched y[{i}] changed from {y} to {g}");
        }
    }
    if let Err(e) = check_close(&got, &want, REL) {
        panic!("{what}: y {e}");
    }
    let t = read(ctx, &tb, c.n_tokens * r_total);
    for tok in 0..c.n_tokens {
        let m = mix[c.mix_offset + tok * c.mix_stride] as usize;
        for ad in 0..n_adapters {
            for r in offsets[ad] as usize..offsets[ad + 1] as usize {
                let v = t[tok * r_total + r];
                let off = scales[m * n_adapters + ad] == 0.0;
                assert!(
                    v.is_finite() && (!off || v == 0.0),
                    "{what}: t[{tok}, {r}] = {v} (adapter {ad}, off {off})"
                );
            }
        }
    }
    worst_rel(&got, &want)
}

#[test]
fn gpu_lora_matches_the_reference_on_edge_shapes() {
    let Some(ctx) = gpu_or_skip("gpu_lora_edge_shapes") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Lora::new(&ctx).unwrap();
    let (t, f) = (true, false);
    let cases = [
        // Odd sizes, a rank-0 adapter in the middle, per-token mix: a base mix (all off), one
        // adapter, two adapters on at once; x and y strided, y with neighbours on both sides.
        Case {
            ranks: vec![5, 0, 7],
            n_in: 37,
            n_out: 45,
            n_tokens: 9,
            x_stride: 41,
            y_stride: 52,
            y_col: 3,
            mix_offset: 0,
            mix_stride: 1,
            on: vec![vec![f, f, f], vec![t, f, f], vec![t, t, t], vec![f, f, t]],
            nan: vec![],
        },
        // r_total 1, one token, n_in 1, broadcast mix.
        Case {
            ranks: vec![1],
            n_in: 1,
            n_out: 1,
            n_tokens: 1,
            x_stride: 1,
            y_stride: 1,
            y_col: 0,
            mix_offset: 0,
            mix_stride: 0,
            on: vec![vec![t]],
            nan: vec![],
        },
        // Broadcast mix (stride 0, offset 2) with two adapters on.
        Case {
            ranks: vec![8, 16],
            n_in: 130,
            n_out: 70,
            n_tokens: 6,
            x_stride: 133,
            y_stride: 70,
            y_col: 0,
            mix_offset: 2,
            mix_stride: 0,
            on: vec![vec![f, f], vec![t, t]],
            nan: vec![],
        },
        // r_total at the maximum 256, tokens not a multiple of the expand's 4, strided mix ids.
        Case {
            ranks: vec![64, 0, 128, 64],
            n_in: 1030,
            n_out: 129,
            n_tokens: 13,
            x_stride: 1030,
            y_stride: 134,
            y_col: 5,
            mix_offset: 1,
            mix_stride: 3,
            on: vec![
                vec![f, f, f, f],
                vec![t, f, t, f],
                vec![f, f, f, t],
                vec![t, t, t, t],
            ],
            nan: vec![],
        },
    ];
    for c in &cases {
        let err = run_case(&ctx, &k, &mut rng, seed, c);
        println!("lora ranks {:?}: relative error {err:.2e}", c.ranks);
    }
}

#[test]
fn gpu_lora_matches_the_reference_on_random_shapes() {
    let Some(ctx) = gpu_or_skip("gpu_lora_random_shapes") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Lora::new(&ctx).unwrap();
    for _ in 0..6 {
        let n_adapters = rng.gen_range(1..=5);
        let mut ranks: Vec<u32> = (0..n_adapters).map(|_| rng.gen_range(0..=40)).collect();
        ranks[0] = ranks[0].max(1);
        let n_mix = rng.gen_range(1..=4);
        let mut on: Vec<Vec<bool>> = (0..n_mix)
            .map(|_| (0..n_adapters).map(|_| rng.gen_bool(0.6)).collect())
            .collect();
        on[n_mix - 1][0] = true; // at least one adapter (of rank >= 1) in use
        let (n_in, n_out) = (rng.gen_range(1..=600), rng.gen_range(1..=300));
        let y_col = rng.gen_range(0..4);
        let mix_stride = rng.gen_range(0..=2);
        let c = Case {
            ranks,
            n_in,
            n_out,
            n_tokens: rng.gen_range(1..=11),
            x_stride: n_in + rng.gen_range(0..4),
            y_stride: y_col + n_out + rng.gen_range(0..4),
            y_col,
            mix_offset: rng.gen_range(0..3),
            mix_stride,
            on,
            nan: vec![],
        };
        let err = run_case(&ctx, &k, &mut rng, seed, &c);
        println!(
            "lora ranks {:?} n_in {n_in} n_out {n_out}: relative error {err:.2e}",
            c.ranks
        );
    }
}

#[test]
fn gpu_lora_does_not_read_adapters_with_zero_scale() {
    let Some(ctx) = gpu_or_skip("gpu_lora_zero_scale") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = Lora::new(&ctx).unwrap();
    let (t, f) = (true, false);
    // Adapter 1 (NaN A rows and B columns) is off everywhere; its rows share shrink workgroups
    // (4 rows each) with adapters 0 and 2, which some tokens use.
    let c = Case {
        ranks: vec![6, 9, 5],
        n_in: 200,
        n_out: 100,
        n_tokens: 7,
        x_stride: 200,
        y_stride: 103,
        y_col: 2,
        mix_offset: 0,
        mix_stride: 1,
        on: vec![vec![t, f, t], vec![f, f, f], vec![t, f, f]],
        nan: vec![1],
    };
    let err = run_case(&ctx, &k, &mut rng, seed, &c);
    println!("lora with a NaN adapter off: relative error {err:.2e}");
}

#[test]
fn lora_shape_errors_are_clear() {
    let Some(ctx) = gpu_or_skip("lora_shape_errors") else {
        return;
    };
    let k = Lora::new(&ctx).unwrap();
    let big = poisoned(&ctx, "big", 1 << 16);
    let short = poisoned(&ctx, "short_offsets", 2);
    let mix = with(&ctx, "mix", &[0u32; 4]);
    let (bw, sw, mw) = (big.whole(), short.whole(), mix.whole());
    let lm = LoraMix {
        scales: &bw,
        n_mix: 1,
        mix: &mw,
        mix_offset: 0,
        mix_stride: 1,
    };
    let mut chain = Chain::new(&ctx).unwrap();
    let mut shrink = |s: &LoraStack, x_stride| {
        k.record_shrink(&mut chain, s, &lm, &bw, x_stride, &bw, 4)
            .unwrap_err()
            .to_string()
    };
    let e = shrink(&stack(&bw, &bw, 300), 64);
    assert!(e.contains("r_total 300"), "{e}");
    let e = shrink(&stack(&bw, &sw, 16), 64);
    assert!(e.contains("offsets") && e.contains("short_offsets"), "{e}");
    let e = shrink(&stack(&bw, &bw, 16), 63);
    assert!(e.contains("x_stride 63"), "{e}");
    let mut chain = Chain::new(&ctx).unwrap();
    let mut expand = |s: &LoraStack, y_stride, y_col| {
        k.record_expand(&mut chain, s, &lm, &bw, &bw, y_stride, y_col, 4)
            .unwrap_err()
            .to_string()
    };
    let e = expand(&stack(&bw, &bw, 257), 64, 0);
    assert!(e.contains("r_total 257"), "{e}");
    let e = expand(&stack(&bw, &sw, 16), 64, 0);
    assert!(e.contains("offsets"), "{e}");
    let e = expand(&stack(&bw, &bw, 16), 70, 7);
    assert!(e.contains("y_col 7 + n_out 64 > y_stride 70"), "{e}");
    // Five tokens with mix stride 1 need five mix ids; the buffer holds four.
    let e = k
        .record_expand(&mut chain, &stack(&bw, &bw, 16), &lm, &bw, &bw, 64, 0, 5)
        .unwrap_err()
        .to_string();
    assert!(e.contains("mix"), "{e}");
}

/// Two adapters over `ab` (A and B), 64 inputs and outputs.
fn stack<'a>(ab: &'a BufferSlice, offsets: &'a BufferSlice, r_total: u32) -> LoraStack<'a> {
    LoraStack {
        a: ab,
        b: ab,
        offsets,
        n_adapters: 2,
        r_total,
        n_in: 64,
        n_out: 64,
    }
}

/// Two adapters (ranks 1 and 2), n_in 2, n_out 2, two tokens with different mixes, by hand.
#[test]
fn lora_ref_matches_hand_computed_values() {
    let a = [1.0, 2.0, /* adapter 1: */ 0.5, -1.0, 3.0, 0.0];
    let b = [
        2.0, /* adapter 1: */ 1.0, 0.0, //
        -1.0, /* adapter 1: */ 0.0, 4.0,
    ];
    let offsets = [0, 1, 3];
    // Mix 0: only adapter 0 (scale 0.5); mix 1: adapter 0 at 1, adapter 1 at 2.
    let scales = [0.5, 0.0, 1.0, 2.0];
    let mix = [1, 0];
    let x = [1.0, 1.0, 9.0, /* token 1: */ 2.0, -1.0, 9.0]; // x_stride 3
    let mut y = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]; // y_stride 3, y_col 1
    lora_ref(
        &a, &b, &offsets, 2, 2, &scales, 2, &mix, 0, 1, &x, 3, &mut y, 3, 1, 2,
    )
    .unwrap();
    // Token 0 (mix 1): A x = [3, -0.5, 3]; scaled [3, -1, 6];
    //   y1 += 2*3 + 1*(-1) + 0*6 = 5; y2 += -1*3 + 0 + 4*6 = 21.
    // Token 1 (mix 0): A x = [0, ...]: adapter 0's row gives 1*2 + 2*(-1) = 0, so nothing.
    assert_eq!(y, [10.0, 25.0, 51.0, 40.0, 50.0, 60.0]);
    // The same by a naive triple loop over all rank rows (every scale taken, zeros included).
    let mut naive = [10.0f32, 20.0, 30.0, 40.0, 50.0, 60.0];
    for tok in 0..2 {
        for j in 0..2 {
            for r in 0..3 {
                let ad = if r < 1 { 0 } else { 1 };
                let s = scales[mix[tok] as usize * 2 + ad];
                let h: f32 = (0..2).map(|kk| a[r * 2 + kk] * x[tok * 3 + kk]).sum();
                naive[tok * 3 + 1 + j] += b[j * 3 + r] * s * h;
            }
        }
    }
    assert_eq!(y, naive);
}

#[test]
fn lora_ref_rejects_bad_mix_ids_and_offsets() {
    let (a, b, x) = ([1.0f32; 4], [1.0f32; 4], [1.0f32; 2]);
    let mut y = [0.0f32; 2];
    let mut call = |offsets: &[u32], mix: &[u32]| {
        lora_ref(
            &a,
            &b,
            offsets,
            2,
            2,
            &[1.0, 1.0],
            1,
            mix,
            0,
            0,
            &x,
            2,
            &mut y,
            2,
            0,
            1,
        )
        .map_err(|e| e.to_string())
    };
    assert!(call(&[0, 1, 2], &[0]).is_ok());
    let e = call(&[0, 1, 2], &[1]).unwrap_err();
    assert!(e.contains("mix id 1 >= n_mix 1"), "{e}");
    let e = call(&[0, 2, 1], &[0]).unwrap_err();
    assert!(e.contains("offsets"), "{e}");
}
