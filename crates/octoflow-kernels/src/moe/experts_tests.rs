//! Random-input tests of [`MoeExperts`] on every weight type: the matvec and the grouped
//! matmul, plain and GLU (both activations), with and without biases, the tensor bound whole
//! and in two pieces of whole experts, against [`moe_experts_ref`] (grouped products on a device
//! with cooperative matrices against [`moe_experts_coop_ref`]: f16-rounded operands).

use octoflow_gguf::GgmlType;
use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
use octoflow_vk::{Buffer, Chain};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use super::*;
use crate::check_close;
use crate::testkit::{buffer_with, poisoned, random, read, seeded, with};

/// As the linear products' bound (linear/tests.rs: f32 sums of up to ~500 products against an
/// f64 reference, judged against at least 1% of the output scale), doubled for the GLU, whose
/// output multiplies two such products (the activations' slopes stay near 1 where they matter).
const REL: f32 = 1e-3;

/// `n_tokens` tokens each routed to `n_used` distinct experts of `n_expert`, skewed so that
/// some experts get many pairs and some none.
fn random_ids(rng: &mut StdRng, n_tokens: usize, n_used: usize, n_expert: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..n_expert as u32).collect();
    let mut ids = Vec::with_capacity(n_tokens * n_used);
    for _ in 0..n_tokens {
        let hot = rng
            .gen_range(0..=n_expert - n_used)
            .min(rng.gen_range(0..=n_expert - n_used));
        all[hot..].shuffle(rng);
        ids.extend_from_slice(&all[hot..hot + n_used]);
    }
    ids
}

/// Columns for `ty` kept short for CPU drivers: floats any count (odd too), blocks up to 384.
fn short_cols(rng: &mut StdRng, ty: GgmlType) -> usize {
    match ty.block_size() {
        1 => rng.gen_range(1..300),
        32 => 32 * rng.gen_range(1..=12),
        bs => bs * rng.gen_range(1..=2),
    }
}

fn check_experts_type(ty: GgmlType) {
    let Some(ctx) = gpu_or_skip(&format!("gpu_moe_experts_{ty}")) else {
        return;
    };
    let (seed, mut rng) = seeded(&format!("moe_experts_{ty}"));
    // the cooperative-matrix variants wherever the device has them
    let k = MoeExperts::new().with_coop(true);
    // ... and their tiles of 128 pairs for any batch (a long prompt's groups take them)
    let k_wide = MoeExperts::new().with_coop(true).with_coop_wide(0);
    // ... and their tiles of 16 pairs for any group (groups past 16 pairs take several)
    let k_narrow = MoeExperts::new().with_coop(true).with_coop_narrow(u32::MAX);
    let mut ways = vec![(false, &k), (true, &k)];
    if k.uses_coop(ctx.caps()) {
        ways.push((true, &k_wide));
        ways.push((true, &k_narrow));
    }
    let tiles = |k: &MoeExperts| {
        if std::ptr::eq(k, &k_wide) {
            "wide"
        } else if std::ptr::eq(k, &k_narrow) {
            "narrow"
        } else {
            "default"
        }
    };
    let acts = [
        MoeAct::Silu,
        MoeAct::SwigluOai {
            alpha: 1.702,
            limit: 7.0,
        },
    ];
    // (tokens, experts per token, experts): decode-sized, and a batch past one 64-pair tile
    for (n_tokens, n_used, n_expert) in [(1usize, 2usize, 4usize), (3, 4, 9), (70, 3, 5)] {
        let n_rows = rng.gen_range(1..150);
        let n_cols = short_cols(&mut rng, ty);
        let rb = octoflow_gguf::quant::quantized_size(ty, n_cols).unwrap();
        let gate = crate::testkit::random_weights(&mut rng, ty, n_expert * n_rows, n_cols);
        let up = crate::testkit::random_weights(&mut rng, ty, n_expert * n_rows, n_cols);
        let (bg, bu) = (
            random(&mut rng, n_expert * n_rows),
            random(&mut rng, n_expert * n_rows),
        );
        let ids = random_ids(&mut rng, n_tokens, n_used, n_expert);
        let n_pairs = ids.len();
        let (offsets, list) = super::moe_group_ref(&ids, n_expert);
        let (ib, ob, lb) = (
            with(&ctx, "ids", &ids),
            with(&ctx, "offsets", &offsets),
            with(&ctx, "list", &list),
        );
        let (bgb, bub) = (with(&ctx, "bias", &bg), with(&ctx, "bias_up", &bu));
        // whole, and in two pieces split at a random expert (a buffer each: any offset)
        let split = rng.gen_range(1..n_expert);
        let pieces = |bytes: &[u8], name: &str| -> Vec<(u32, u32, Buffer)> {
            let eb = n_rows * rb;
            let whole = vec![(0, n_expert as u32, buffer_with(&ctx, name, bytes))];
            let two = vec![
                (
                    0,
                    split as u32,
                    buffer_with(&ctx, name, &bytes[..split * eb]),
                ),
                (
                    split as u32,
                    (n_expert - split) as u32,
                    buffer_with(&ctx, name, &bytes[split * eb..]),
                ),
            ];
            [whole, two].concat()
        };
        let (gp, up_p) = (pieces(&gate, "gate_exps"), pieces(&up, "up_exps"));
        for glu in [None, Some(acts[0]), Some(acts[1])] {
            for biased in [false, true] {
                // gate/up products read each token's input, plain ones (down) each pair's
                let x_div = if glu.is_some() { n_used } else { 1 };
                let x = random(&mut rng, n_pairs / x_div * n_cols);
                let xb = with(&ctx, "x", &x);
                let args = (
                    ty,
                    &gate,
                    glu.map(|a| (up.as_slice(), a)),
                    biased.then_some((bg.as_slice(), glu.map(|_| bu.as_slice()))),
                    n_rows,
                    n_cols,
                    &x,
                    x_div,
                    &ids,
                );
                let want = |coop: bool| {
                    let (ty, w, glu, bias, n_rows, n_cols, x, x_div, ids) = args;
                    if coop {
                        moe_experts_coop_ref(ty, w, glu, bias, n_rows, n_cols, x, x_div, ids)
                    } else {
                        moe_experts_ref(ty, w, glu, bias, n_rows, n_cols, x, x_div, ids)
                    }
                    .unwrap()
                };
                let (plain, coop) = (want(false), want(true));
                for &(grouped, k) in &ways {
                    let want = if grouped && k.uses_coop(ctx.caps()) {
                        &coop
                    } else {
                        &plain
                    };
                    for set in [&gp[..1], &gp[1..]] {
                        let yb = poisoned(&ctx, "y", n_pairs * n_rows);
                        let mut chain = Chain::new(&ctx).unwrap();
                        for (i, (e_begin, n_experts, buf)) in set.iter().enumerate() {
                            let (wd, ud) =
                                (buf.whole(), up_p[i + usize::from(set.len() == 2)].2.whole());
                            let w = ExpertWeights {
                                ty,
                                data: &wd,
                                e_begin: *e_begin,
                                n_experts: *n_experts,
                                n_rows: n_rows as u32,
                                n_cols: n_cols as u32,
                            };
                            let u = ExpertWeights { data: &ud, ..w };
                            let (obw, lbw) = (ob.whole(), lb.whole());
                            let groups = grouped.then_some(Groups {
                                offsets: &obw,
                                list: &lbw,
                                max_group: n_tokens as u32,
                            });
                            let (bgw, buw) = (bgb.whole(), bub.whole());
                            k.record(
                                &mut chain,
                                &ExpertsArgs {
                                    xq: None,
                                    w,
                                    glu: glu.map(|a| (u, a)),
                                    bias: biased.then_some(&bgw),
                                    bias_up: (biased && glu.is_some()).then_some(&buw),
                                    n_expert: n_expert as u32,
                                    x: &xb.whole(),
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
                        if let Err(e) = check_close(&got, want, REL) {
                            panic!(
                                "moe experts {ty} {n_tokens}x{n_used} of {n_expert}, {n_rows}x{n_cols}, \
                                 glu {glu:?}, bias {biased}, grouped {grouped} ({} tiles), {} pieces, \
                                 seed {seed}: {e}",
                                tiles(k),
                                set.len()
                            );
                        }
                    }
                }
                if glu.is_none() {
                    let p = Plain {
                        ty,
                        w: &gp[0].2,
                        n_expert,
                        n_rows,
                        n_cols,
                        ids: &ib,
                        n_used,
                        bias: biased.then_some(&bgb),
                        x: &xb,
                        want: &plain,
                    };
                    check_combined(&ctx, &k, &p, seed, &mut rng);
                }
            }
        }
    }
    assert_no_validation_errors(&ctx);
}

/// The operands of one plain product, for [`check_combined`].
struct Plain<'a> {
    ty: GgmlType,
    w: &'a Buffer,
    n_expert: usize,
    n_rows: usize,
    n_cols: usize,
    ids: &'a Buffer,
    n_used: usize,
    bias: Option<&'a Buffer>,
    /// `[n_pairs, n_cols]`: each pair's input.
    x: &'a Buffer,
    /// The reference products, `[n_pairs, n_rows]`.
    want: &'a [f32],
}

/// The COMBINE variant of the plain products `p` (the whole tensor bound): each token's pairs
/// weighted and added to a random stream, against [`moe_combine_ref`] of the reference
/// products; `y` is not written.
fn check_combined(
    ctx: &octoflow_vk::Context,
    k: &MoeExperts,
    p: &Plain,
    seed: u64,
    rng: &mut StdRng,
) {
    let n_pairs = p.want.len() / p.n_rows;
    let n_tokens = n_pairs / p.n_used;
    let wts = random(rng, n_pairs);
    let x0 = random(rng, n_tokens * p.n_rows);
    let mut want = x0.clone();
    moe_combine_ref(p.want, &wts, &mut want, p.n_used);
    let (wb, sb) = (with(ctx, "weights", &wts), with(ctx, "stream", &x0));
    let yb = poisoned(ctx, "y", 4);
    let (wd, bd, sw) = (p.w.whole(), wb.whole(), sb.whole());
    let bias = p.bias.map(|b| b.whole());
    let mut chain = Chain::new(ctx).unwrap();
    k.record(
        &mut chain,
        &ExpertsArgs {
            xq: None,
            w: ExpertWeights {
                ty: p.ty,
                data: &wd,
                e_begin: 0,
                n_experts: p.n_expert as u32,
                n_rows: p.n_rows as u32,
                n_cols: p.n_cols as u32,
            },
            glu: None,
            bias: bias.as_ref(),
            bias_up: None,
            n_expert: p.n_expert as u32,
            x: &p.x.whole(),
            x_div: 1,
            y: &yb.whole(),
            ids: &p.ids.whole(),
            n_pairs: n_pairs as u32,
            groups: None,
            combine: Some(Combine {
                weights: &bd,
                x: &sw,
                n_used: p.n_used as u32,
            }),
        },
    )
    .unwrap();
    chain.run().unwrap();
    let got = read(ctx, &sb, want.len());
    if let Err(e) = check_close(&got, &want, REL) {
        panic!(
            "moe experts {} combined, {n_tokens}x{} of {}, {}x{}, bias {}, seed {seed}: {e}",
            p.ty,
            p.n_used,
            p.n_expert,
            p.n_rows,
            p.n_cols,
            p.bias.is_some()
        );
    }
    assert!(read(ctx, &yb, 1)[0].is_nan(), "{}: y was written", p.ty);
}
macro_rules! experts_type_tests {
    ($($name:ident => $ty:ident),*) => {$(
        #[test]
        fn $name() {
            check_experts_type(GgmlType::$ty);
        }
    )*};
}

experts_type_tests!(
    gpu_moe_experts_f32 => F32, gpu_moe_experts_f16 => F16, gpu_moe_experts_q4_0 => Q4_0,
    gpu_moe_experts_q4_1 => Q4_1, gpu_moe_experts_q5_0 => Q5_0, gpu_moe_experts_q5_1 => Q5_1,
    gpu_moe_experts_q8_0 => Q8_0, gpu_moe_experts_q4_k => Q4_K, gpu_moe_experts_q5_k => Q5_K,
    gpu_moe_experts_q6_k => Q6_K, gpu_moe_experts_bf16 => BF16, gpu_moe_experts_mxfp4 => MXFP4,
    gpu_moe_experts_iq4_nl => IQ4_NL, gpu_moe_experts_q2_k => Q2_K, gpu_moe_experts_q3_k => Q3_K,
    gpu_moe_experts_iq4_xs => IQ4_XS
);

#[test]
fn mismatched_operands_are_clear_errors() {
    let Some(ctx) = gpu_or_skip("moe_experts_bad") else {
        return;
    };
    let k = MoeExperts::new();
    let wb = poisoned(&ctx, "w", 4 * 8 * 32);
    let b = poisoned(&ctx, "b", 1024);
    let (wd, bd) = (wb.whole(), b.whole());
    let w = ExpertWeights {
        ty: GgmlType::F32,
        data: &wd,
        e_begin: 0,
        n_experts: 4,
        n_rows: 8,
        n_cols: 32,
    };
    fn args<'a>(
        w: ExpertWeights<'a>,
        glu: Option<(ExpertWeights<'a>, MoeAct)>,
        bd: &'a octoflow_vk::BufferSlice,
    ) -> ExpertsArgs<'a> {
        ExpertsArgs {
            xq: None,
            w,
            glu,
            bias: None,
            bias_up: None,
            n_expert: 4,
            x: bd,
            x_div: 2,
            y: bd,
            ids: bd,
            n_pairs: 4,
            groups: None,
            combine: None,
        }
    }
    let mut chain = Chain::new(&ctx).unwrap();
    let err = |a: &ExpertsArgs| {
        k.record(&mut Chain::new(&ctx).unwrap(), a)
            .unwrap_err()
            .to_string()
    };
    let e = err(&args(ExpertWeights { e_begin: 2, ..w }, None, &bd));
    assert!(e.contains("experts 2..6 of a tensor of 4"), "{e}");
    let e = err(&args(
        w,
        Some((ExpertWeights { n_rows: 4, ..w }, MoeAct::Silu)),
        &bd,
    ));
    assert!(e.contains("both must match"), "{e}");
    let e = err(&ExpertsArgs {
        xq: None,
        n_pairs: 3,
        ..args(w, None, &bd)
    });
    assert!(e.contains("not whole rows"), "{e}");
    let e = err(&args(
        ExpertWeights {
            ty: GgmlType::Q8_1,
            ..w
        },
        None,
        &bd,
    ));
    assert!(e.contains("not supported"), "{e}");
    let cb = |n_used| {
        Some(Combine {
            weights: &bd,
            x: &bd,
            n_used,
        })
    };
    let e = err(&ExpertsArgs {
        xq: None,
        combine: cb(2),
        ..args(w, None, &bd)
    });
    assert!(e.contains("one input row per pair"), "{e}");
    let e = err(&ExpertsArgs {
        xq: None,
        x_div: 1,
        combine: cb(9),
        ..args(w, None, &bd)
    });
    assert!(e.contains("whole tokens of 1..=8 pairs"), "{e}");
    let e = err(&ExpertsArgs {
        xq: None,
        x_div: 1,
        combine: cb(2),
        ..args(ExpertWeights { n_experts: 3, ..w }, None, &bd)
    });
    assert!(e.contains("needs the whole tensor"), "{e}");
    k.record(&mut chain, &args(w, None, &bd)).unwrap();
}

// Timing of a one-token mixture-of-experts step (benchmarks, with the `bench` feature).
#[cfg(feature = "bench")]
#[path = "../../benches/moe_bench.rs"]
mod bench;
