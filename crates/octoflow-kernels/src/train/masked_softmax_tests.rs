//! Tests of the masked softmax kernels (device runs against the references, the references
//! against finite differences, shape errors).

use octoflow_vk::testing::gpu_or_skip;
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::check_close;
use crate::grad_check::{central_difference, dot};
use crate::testkit::{poisoned, read, with};

/// exp of a max-subtracted argument is a few ulps off and the normalizing sum is f32 over at
/// most 300 terms (~1e-6 relative): 5e-5 relative, as the unmasked soft_max (measured up to
/// 8e-7 on lavapipe).
const REL_FORWARD: f32 = 5e-5;

/// `scale p (dp - D)`: the f32 sum D over up to 300 products is off by ~1e-6 of Σ|p dp| ≈
/// max|dp|, and `dp - D` can cancel, so the error is absolute, ~1e-6 of scale·p·max|dp|,
/// against check_close's 1% floor of the largest |ds|: 1e-4 relative (measured up to 2.4e-5 on
/// lavapipe).
const REL_BACKWARD: f32 = 1e-4;

/// One position per row `(s, i)`: documents restart at random rows (position 0 again), and a
/// sequence may start inside a document begun earlier (positions above the row index, which
/// the mask reads as "sees every earlier row").
fn doc_positions(rng: &mut StdRng, n_seq: usize, seq_len: usize) -> Vec<u32> {
    let mut out = Vec::with_capacity(n_seq * seq_len);
    for _ in 0..n_seq {
        let mut p: u32 = if rng.gen_bool(0.4) {
            rng.gen_range(1..50)
        } else {
            0
        };
        for i in 0..seq_len {
            if i > 0 && rng.gen_range(0..seq_len) < 3 {
                p = 0;
            }
            out.push(p);
            p += 1;
        }
    }
    out
}

/// The u32 words of a pos buffer: `offset` words of garbage, then every row's position
/// followed by `stride - 1` garbage words.
fn pos_words(rng: &mut StdRng, positions: &[u32], offset: usize, stride: usize) -> Vec<u32> {
    let mut w: Vec<u32> = (0..offset).map(|_| rng.gen()).collect();
    for &p in positions {
        w.push(p);
        w.extend((1..stride).map(|_| rng.gen::<u32>()));
    }
    w
}

/// Whether score `k` of the `[n_seq, n_head, seq_len, seq_len]` tensor is visible.
fn is_visible(k: usize, pos: &[u32], stride: usize, shape: (usize, usize, usize, usize)) -> bool {
    let (_, n_head, seq_len, window) = shape;
    let (r, j) = (k / seq_len, k % seq_len);
    let (s, i) = (r / seq_len / n_head, r % seq_len);
    visible(pos, stride, s, i, seq_len, window).contains(&j)
}

#[test]
fn gpu_masked_softmax_matches_the_references_on_random_inputs() {
    let Some(ctx) = gpu_or_skip("gpu_masked_softmax_matches_the_references") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let k = MaskedSoftmax::new(&ctx).unwrap();
    // (n_seq, n_head, seq_len, window, pos_stride, scale)
    let cases = [
        (1usize, 1usize, 1usize, 0usize, 1usize, 1.0f32),
        (2, 3, 17, 0, 2, 0.125),
        (1, 2, 300, 0, 1, 0.125),
        (3, 2, 64, 5, 1, 1.0),
        (2, 1, 129, 1, 2, 0.5),
        (1, 4, 257, 100, 1, 0.088),
        (2, 2, 300, 37, 2, 0.125),
    ];
    for (n_seq, n_head, seq_len, window, stride, scale) in cases {
        let shape = (n_seq, n_head, seq_len, window);
        let n = n_seq * n_head * seq_len * seq_len;
        let offset = rng.gen_range(0..4usize);
        let positions = doc_positions(&mut rng, n_seq, seq_len);
        let words = pos_words(&mut rng, &positions, offset, stride);
        let pos = &words[offset..];
        // Invisible entries hold NaN: the kernels must neither read them nor leave them.
        let poison = |v: Vec<f32>| -> Vec<f32> {
            (v.into_iter().enumerate())
                .map(|(i, x)| {
                    if is_visible(i, pos, stride, shape) {
                        x
                    } else {
                        f32::NAN
                    }
                })
                .collect()
        };
        let x = poison((0..n).map(|_| rng.gen_range(-30.0..30.0)).collect());
        let dp = poison((0..n).map(|_| rng.gen_range(-2.0..2.0)).collect());
        let mut want_p = x.clone();
        masked_softmax_ref(
            &mut want_p,
            pos,
            stride,
            n_seq,
            n_head,
            seq_len,
            window,
            scale,
        );
        let p_in = poison(want_p.clone());
        let mut want_ds = dp.clone();
        masked_softmax_back_ref(
            &p_in,
            &mut want_ds,
            pos,
            stride,
            n_seq,
            n_head,
            seq_len,
            window,
            scale,
        );

        let (xb, pb, dpb) = (
            with(&ctx, "x", &x),
            with(&ctx, "p", &p_in),
            with(&ctx, "dp", &dp),
        );
        let posb = with(&ctx, "pos", &words);
        let ps = posb.whole();
        let mask = SoftmaxMask {
            pos: &ps,
            pos_offset: offset as u32,
            pos_stride: stride as u32,
            n_seq: n_seq as u32,
            n_head: n_head as u32,
            seq_len: seq_len as u32,
            window: window as u32,
            scale,
        };
        let mut chain = Chain::new(&ctx).unwrap();
        k.forward(&mut chain, &xb.whole(), &mask).unwrap();
        k.backward(&mut chain, &pb.whole(), &dpb.whole(), &mask)
            .unwrap();
        chain.run().unwrap();
        let what =
            format!("{n_seq}x{n_head}x{seq_len} window {window} stride {stride}, seed {seed}");
        if let Err(e) = check_close(&read(&ctx, &xb, n), &want_p, REL_FORWARD) {
            panic!("masked_softmax forward {what}: {e}");
        }
        if let Err(e) = check_close(&read(&ctx, &dpb, n), &want_ds, REL_BACKWARD) {
            panic!("masked_softmax backward {what}: {e}");
        }
    }
}

#[test]
fn references_mask_by_document_and_window() {
    // seq_len 4, one head; row positions 0 1 0 1 (a document restarts at row 2), window 0:
    // row 3 sees keys 2..=3 only, with equal scores 1/2 each.
    let mut x = vec![1f32; 16];
    masked_softmax_ref(&mut x, &[0, 1, 0, 1], 1, 1, 1, 4, 0, 1.0);
    let want = [
        [1.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
        [0.0, 0.0, 0.5, 0.5],
    ];
    assert_eq!(x, want.concat());
    // positions beyond the row (a continued document) with window 2: keys i-1..=i
    let mut x = vec![1f32; 9];
    masked_softmax_ref(&mut x, &[9, 10, 11], 1, 1, 1, 3, 2, 1.0);
    assert_eq!(x, [1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.0, 0.5, 0.5]);
}

#[test]
fn back_reference_is_the_gradient_of_the_forward_reference() {
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let (n_seq, n_head, seq_len) = (2usize, 2usize, 6usize);
    for (window, scale) in [(0usize, 0.7f32), (3, -1.3)] {
        let n = n_seq * n_head * seq_len * seq_len;
        let pos = doc_positions(&mut rng, n_seq, seq_len);
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let dp: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let forward = |x: &[f32]| {
            let mut p = x.to_vec();
            masked_softmax_ref(&mut p, &pos, 1, n_seq, n_head, seq_len, window, scale);
            p
        };
        let fd = central_difference(&x, 4e-2, |x| dot(&forward(x), &dp));
        let mut grad = dp.clone();
        masked_softmax_back_ref(
            &forward(&x),
            &mut grad,
            &pos,
            1,
            n_seq,
            n_head,
            seq_len,
            window,
            scale,
        );
        // f32 rounding of p (~6e-8 of a loss of ~1 per row) over steps of ±2e-2 and ±4e-2
        // (Richardson-combined) is ~1e-5 absolute against gradients of ~1: 1e-3 relative
        if let Err(e) = check_close(&grad, &fd, 1e-3) {
            panic!(
                "masked_softmax_back_ref vs finite differences, window {window}, seed {seed}: {e}"
            );
        }
    }
}

#[test]
fn short_operands_are_shape_errors() {
    let Some(ctx) = gpu_or_skip("masked_softmax_shape_errors") else {
        return;
    };
    let k = MaskedSoftmax::new(&ctx).unwrap();
    let x = poisoned(&ctx, "scores", 2 * 8 * 8);
    let short = poisoned(&ctx, "grad_p", 2 * 8 * 8 - 1);
    let pos = with(&ctx, "positions", &[0u32; 15]);
    let ps = pos.whole();
    let mut mask = SoftmaxMask {
        pos: &ps,
        pos_offset: 0,
        pos_stride: 1,
        n_seq: 2,
        n_head: 1,
        seq_len: 8,
        window: 0,
        scale: 1.0,
    };
    let mut chain = Chain::new(&ctx).unwrap();
    // 2 x 8 rows need 16 positions
    let err = k
        .forward(&mut chain, &x.whole(), &mask)
        .unwrap_err()
        .to_string();
    assert!(err.contains("pos") && err.contains("positions"), "{err}");
    mask.n_seq = 1;
    k.forward(&mut chain, &x.whole(), &mask).unwrap();
    // one sequence's 64 scores fit
    k.backward(&mut chain, &x.whole(), &short.whole(), &mask)
        .unwrap();
    mask.n_seq = 2;
    mask.pos_stride = 0;
    let err = k
        .backward(&mut chain, &x.whole(), &short.whole(), &mask)
        .unwrap_err()
        .to_string();
    assert!(err.contains("dp") && err.contains("grad_p"), "{err}");
    mask.seq_len = 0;
    let err = k
        .forward(&mut chain, &x.whole(), &mask)
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty"), "{err}");
}
