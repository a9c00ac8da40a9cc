//! Random-input tests of the expert products on 8-bit integer dot products (`moe_dot.comp`)
//! for every type it reads: plain and GLU (both activations), with and without biases, the
//! tensor bound whole and in two pieces of whole experts, the pairs one by one and grouped by
//! expert (the GROUPED variants, runs of up to [`GROUP_PAIRS`] pairs), and the combined down
//! products, against [`moe_experts_dot_ref`] (each pair's input quantized as the kernel does).

use octoflow_gguf::GgmlType;
use octoflow_vk::testing::{assert_no_validation_errors, gpu_with_integer_dot_or_skip};
use octoflow_vk::{Buffer, Chain, Context};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use super::experts_dot::GROUP_PAIRS;
use super::*;
use crate::testkit::{buffer_with, poisoned, random, random_weights, read, seeded, with};

/// Bound relative to the larger of |want| and 1% of the largest |want|: f32 sums against an
/// f64 reference of the same 8-bit codes of x (as the linear kernel's, doubled for the GLU).
const REL: f64 = 1e-3;

/// `got` within [`REL`] of `want` plus each output's slack (codes of x at a rounding
/// boundary); NaN fails.
fn check(got: &[f32], want: &[f32], slack: &[f64], what: &str) {
    crate::testkit::check_with_slack(got, want, slack, REL, what);
}

/// Each of `n_tokens` tokens routed to `n_used` distinct experts of `n_expert`.
fn random_ids(rng: &mut StdRng, n_tokens: usize, n_used: usize, n_expert: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..n_expert as u32).collect();
    (0..n_tokens)
        .flat_map(|_| {
            all.shuffle(rng);
            all[..n_used].to_vec()
        })
        .collect()
}

/// The tensor `bytes` (`n_expert` experts of `eb` bytes) bound whole, and in two pieces split
/// at expert `split`: `(e_begin, n_experts, buffer)` per piece.
fn pieces(
    ctx: &Context,
    bytes: &[u8],
    eb: usize,
    n_expert: usize,
    split: usize,
) -> Vec<Vec<(u32, u32, Buffer)>> {
    vec![
        vec![(0, n_expert as u32, buffer_with(ctx, "experts", bytes))],
        vec![
            (
                0,
                split as u32,
                buffer_with(ctx, "experts", &bytes[..split * eb]),
            ),
            (
                split as u32,
                (n_expert - split) as u32,
                buffer_with(ctx, "experts", &bytes[split * eb..]),
            ),
        ],
    ]
}

fn check_dot_type(ty: GgmlType) {
    let Some(ctx) = gpu_with_integer_dot_or_skip(&format!("gpu_moe_dot_{ty}")) else {
        return;
    };
    let (seed, mut rng) = seeded(&format!("moe_dot_{ty}"));
    let k = MoeExperts::new()
        .with_dot(ctx.caps(), true)
        .with_dot_groups(u32::MAX);
    // the GLU on inputs already quantized (as the fused router writes them)
    let kx = MoeExperts::new().with_dot(ctx.caps(), true).with_xq(true);
    let acts = [
        MoeAct::Silu,
        MoeAct::SwigluOai {
            alpha: 1.702,
            limit: 7.0,
        },
    ];
    // (tokens, experts per token, experts): one decode token, a few, and a batch whose groups
    // take several runs
    let many = 2 * GROUP_PAIRS as usize + 3;
    for (n_tokens, n_used, n_expert) in [(1usize, 2usize, 4usize), (3, 4, 9), (many, 3, 5)] {
        let n_rows = rng.gen_range(1..150);
        let n_cols = match ty.block_size() {
            32 => 64 * rng.gen_range(1..=6),
            bs => bs * rng.gen_range(1..=2),
        };
        assert!(k.uses_dot(ty, n_cols as u32), "{ty}: {n_cols} columns");
        let rb = octoflow_gguf::quant::quantized_size(ty, n_cols).unwrap();
        let gate = random_weights(&mut rng, ty, n_expert * n_rows, n_cols);
        let up = random_weights(&mut rng, ty, n_expert * n_rows, n_cols);
        let (bg, bu) = (
            random(&mut rng, n_expert * n_rows),
            random(&mut rng, n_expert * n_rows),
        );
        let ids = random_ids(&mut rng, n_tokens, n_used, n_expert);
        let n_pairs = ids.len();
        let ib = with(&ctx, "ids", &ids);
        let (bgb, bub) = (with(&ctx, "bias", &bg), with(&ctx, "bias_up", &bu));
        let split = rng.gen_range(1..n_expert);
        let gp = pieces(&ctx, &gate, n_rows * rb, n_expert, split);
        let upp = pieces(&ctx, &up, n_rows * rb, n_expert, split);
        for glu in [None, Some(acts[0]), Some(acts[1])] {
            for biased in [false, true] {
                let x_div = if glu.is_some() { n_used } else { 1 };
                let x = random(&mut rng, n_pairs / x_div * n_cols);
                let xb = with(&ctx, "x", &x);
                let (want, slack) = moe_experts_dot_ref(
                    ty,
                    &gate,
                    glu.map(|a| (up.as_slice(), a)),
                    biased.then_some((bg.as_slice(), glu.map(|_| bu.as_slice()))),
                    n_rows,
                    n_cols,
                    &x,
                    x_div,
                    &ids,
                )
                .unwrap();
                let (offsets, list) = moe_group_ref(&ids, n_expert);
                let (ob, lb) = (with(&ctx, "offsets", &offsets), with(&ctx, "list", &list));
                let (os, ls) = (ob.whole(), lb.whole());
                let grouped = Groups {
                    offsets: &os,
                    list: &ls,
                    max_group: n_tokens as u32,
                };
                let glu_on = glu.is_some();
                assert!(k.groups_use_dot(ty, n_cols as u32, n_tokens as u32, glu_on));
                assert!(
                    kx.takes_quantized(ty, n_cols as u32) && !k.takes_quantized(ty, n_cols as u32)
                );
                let xq: Vec<u8> = crate::linear::quantize_q8_ref(&x, n_cols)
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .collect();
                let xqb = buffer_with(&ctx, "xq", &xq);
                let xqd = xqb.whole();
                let mut runs = vec![
                    (0, None, None),
                    (1, None, None),
                    (0, Some(grouped), None),
                    (1, Some(grouped), None),
                ];
                if glu_on {
                    runs.extend([(0, None, Some(&xqd)), (1, None, Some(&xqd))]);
                }
                for (si, groups, xq) in runs {
                    let k = if xq.is_some() { &kx } else { &k };
                    let (set, up_set) = (&gp[si], &upp[si]);
                    let yb = poisoned(&ctx, "y", n_pairs * n_rows);
                    // given its input quantized, the product must not read x: NaN there
                    let nan_x = poisoned(&ctx, "x", x.len());
                    let xd = if xq.is_some() {
                        nan_x.whole()
                    } else {
                        xb.whole()
                    };
                    let mut chain = Chain::new(&ctx).unwrap();
                    for ((e_begin, n_experts, buf), (_, _, ubuf)) in set.iter().zip(up_set) {
                        let (wd, ud) = (buf.whole(), ubuf.whole());
                        let w = ExpertWeights {
                            ty,
                            data: &wd,
                            e_begin: *e_begin,
                            n_experts: *n_experts,
                            n_rows: n_rows as u32,
                            n_cols: n_cols as u32,
                        };
                        let (bgw, buw) = (bgb.whole(), bub.whole());
                        k.record(
                            &mut chain,
                            &ExpertsArgs {
                                xq,
                                w,
                                glu: glu.map(|a| (ExpertWeights { data: &ud, ..w }, a)),
                                bias: biased.then_some(&bgw),
                                bias_up: (biased && glu.is_some()).then_some(&buw),
                                n_expert: n_expert as u32,
                                x: &xd,
                                x_div: x_div as u32,
                                y: &yb.whole(),
                                ids: &ib.whole(),
                                n_pairs: n_pairs as u32,
                                groups,
                                combine: None,
                            },
                        )
                        .unwrap();
                    }
                    chain.run().unwrap();
                    let got = read(&ctx, &yb, n_pairs * n_rows);
                    let what = format!(
                        "moe dot {ty} {n_tokens}x{n_used} of {n_expert}, {n_rows}x{n_cols}, glu \
                         {glu:?}, bias {biased}, {} pieces, grouped {}, x quantized {}, seed \
                         {seed}",
                        set.len(),
                        groups.is_some(),
                        xq.is_some()
                    );
                    check(&got, &want, &slack, &what);
                }
                if glu.is_none() {
                    let what = format!(
                        "moe dot {ty} combined, {n_tokens}x{n_used} of {n_expert}, \
                         {n_rows}x{n_cols}, bias {biased}, seed {seed}"
                    );
                    let bias = biased.then_some(&bgb);
                    let p = (&gp[0][0].2, n_expert, n_rows, n_cols, n_used);
                    check_combined(
                        &ctx,
                        &k,
                        ty,
                        p,
                        (&ib, bias, &xb),
                        (&want, &slack),
                        &what,
                        &mut rng,
                    );
                }
            }
        }
    }
    assert_no_validation_errors(&ctx);
}

/// The combined down products of the plain products whose reference is `want` (with its
/// slack): each token's pairs weighted and added to a random stream.
#[allow(clippy::too_many_arguments)]
fn check_combined(
    ctx: &Context,
    k: &MoeExperts,
    ty: GgmlType,
    (w, n_expert, n_rows, n_cols, n_used): (&Buffer, usize, usize, usize, usize),
    (ids, bias, x): (&Buffer, Option<&Buffer>, &Buffer),
    (want, slack): (&[f32], &[f64]),
    what: &str,
    rng: &mut StdRng,
) {
    let n_pairs = want.len() / n_rows;
    let n_tokens = n_pairs / n_used;
    let wts = random(rng, n_pairs);
    let x0 = random(rng, n_tokens * n_rows);
    let mut stream = x0.clone();
    crate::moe::moe_combine_ref(want, &wts, &mut stream, n_used);
    let combined_slack: Vec<f64> = (0..n_tokens * n_rows)
        .map(|i| {
            let (t, r) = (i / n_rows, i % n_rows);
            (0..n_used)
                .map(|j| {
                    let p = t * n_used + j;
                    f64::from(wts[p]).abs() * slack[p * n_rows + r]
                })
                .sum()
        })
        .collect();
    let (wb, sb) = (with(ctx, "weights", &wts), with(ctx, "stream", &x0));
    let yb = poisoned(ctx, "y", 4);
    let (wd, bd, sw) = (w.whole(), wb.whole(), sb.whole());
    let bias = bias.map(|b| b.whole());
    let mut chain = Chain::new(ctx).unwrap();
    k.record(
        &mut chain,
        &ExpertsArgs {
            xq: None,
            w: ExpertWeights {
                ty,
                data: &wd,
                e_begin: 0,
                n_experts: n_expert as u32,
                n_rows: n_rows as u32,
                n_cols: n_cols as u32,
            },
            glu: None,
            bias: bias.as_ref(),
            bias_up: None,
            n_expert: n_expert as u32,
            x: &x.whole(),
            x_div: 1,
            y: &yb.whole(),
            ids: &ids.whole(),
            n_pairs: n_pairs as u32,
            groups: None,
            combine: Some(Combine {
                weights: &bd,
                x: &sw,
                n_used: n_used as u32,
            }),
        },
    )
    .unwrap();
    chain.run().unwrap();
    check(
        &read(ctx, &sb, stream.len()),
        &stream,
        &combined_slack,
        what,
    );
    assert!(read(ctx, &yb, 1)[0].is_nan(), "{what}: y was written");
}

macro_rules! dot_type_tests {
    ($($name:ident => $ty:ident),*) => {$(
        #[test]
        fn $name() {
            check_dot_type(GgmlType::$ty);
        }
    )*};
}

dot_type_tests!(
    gpu_moe_dot_q4_0 => Q4_0, gpu_moe_dot_q4_1 => Q4_1, gpu_moe_dot_q5_0 => Q5_0,
    gpu_moe_dot_q5_1 => Q5_1, gpu_moe_dot_q8_0 => Q8_0, gpu_moe_dot_mxfp4 => MXFP4,
    gpu_moe_dot_q4_k => Q4_K, gpu_moe_dot_q5_k => Q5_K, gpu_moe_dot_q6_k => Q6_K
);

/// What the kernel does not read stays on the f32 matvec: other types, rows of a wrong width.
#[test]
fn moe_dot_takes_only_what_it_reads() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("moe_dot_takes") else {
        return;
    };
    let k = MoeExperts::new().with_dot(ctx.caps(), true);
    assert!(k.uses_dot(GgmlType::MXFP4, 2880) && k.uses_dot(GgmlType::Q4_1, 32));
    assert!(
        !k.uses_dot(GgmlType::Q4_0, 32),
        "Q4_0 rows need whole words"
    );
    assert!(k.uses_dot(GgmlType::Q4_K, 256) && !k.uses_dot(GgmlType::Q4_K, 128));
    assert!(!k.uses_dot(GgmlType::Q2_K, 256) && !k.uses_dot(GgmlType::F32, 64));
    assert!(!k.uses_dot(GgmlType::MXFP4, 32 * 1024));
    assert!(!MoeExperts::new()
        .with_dot(ctx.caps(), false)
        .uses_dot(GgmlType::MXFP4, 2880));
}
