//! Consistency of the forward pass on tiny random models: batching, chunking, caching and
//! rewinding must not change the logits; windows must hide what they hide.

use crate::testing::{rng, tiny_model, TinyShape, TINY};
use crate::{mean_nll, token_nlls, Forward, Logits, Model, ModelError};

const ARCHS: [&str; 7] = [
    "llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "gpt-oss",
];
const TOKENS: [u32; 12] = [3, 17, 42, 0, 9, 49, 21, 7, 7, 30, 11, 5];

fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

fn all_logits(m: &Model, tokens: &[u32]) -> Vec<f32> {
    m.session(64).forward(tokens, 0, Logits::All).unwrap()
}

#[test]
fn one_batch_equals_token_by_token_decoding() {
    for arch in ARCHS {
        let m = tiny_model(arch, TINY, &mut rng(arch));
        let batch = all_logits(&m, &TOKENS);
        let mut s = m.session(64);
        for (i, &t) in TOKENS.iter().enumerate() {
            let step = s.decode(t).unwrap();
            assert_close(
                &step,
                &batch[i * 50..(i + 1) * 50],
                &format!("{arch} pos {i}"),
            );
        }
        assert_eq!(s.n_past(), TOKENS.len());
    }
}

#[test]
fn chunked_prefill_equals_one_batch() {
    for arch in ARCHS {
        let m = tiny_model(arch, TINY, &mut rng(arch));
        let batch = all_logits(&m, &TOKENS);
        let last = m.session(64).prefill(&TOKENS, 5).unwrap();
        assert_close(&last, &batch[11 * 50..], arch);
    }
}

#[test]
fn rewinding_to_an_earlier_position_recomputes_the_same_logits() {
    let m = tiny_model("qwen2", TINY, &mut rng("rewind"));
    let mut s = m.session(64);
    let first = s.forward(&TOKENS, 0, Logits::Last).unwrap();
    s.forward(&[1, 2, 3], 4, Logits::Last).unwrap();
    let again = s.forward(&TOKENS[4..], 4, Logits::Last).unwrap();
    assert_close(&again, &first, "rewound");
}

#[test]
fn gemma3_sliding_window_limits_what_a_position_can_see() {
    // two local layers with window 4: position p depends on positions > p - 2 * 3 only
    let m = tiny_model("gemma3", TINY, &mut rng("gemma3_window"));
    let mut other = TOKENS;
    other[0] = 44;
    other[1] = 45;
    let (a, b) = (all_logits(&m, &TOKENS), all_logits(&m, &other));
    assert_close(&a[11 * 50..], &b[11 * 50..], "position 11");
    assert!(
        a[2 * 50..3 * 50] != b[2 * 50..3 * 50],
        "position 2 must see position 0"
    );
}

#[test]
fn taps_expose_every_layer_and_the_returned_logits() {
    let shape = TinyShape { n_layer: 3, ..TINY };
    let m = tiny_model("gemma3", shape, &mut rng("taps"));
    let mut names = Vec::new();
    let mut result = Vec::new();
    let logits = m
        .session(64)
        .forward_observed(&TOKENS[..4], 0, Logits::All, &mut |t| {
            names.push((t.layer, t.name));
            assert_eq!(t.data.len() % t.n_rows, 0);
            if t.name == "result_output" {
                result = t.data.to_vec();
            }
        })
        .unwrap();
    for il in 0..3 {
        for name in [
            "attn_norm",
            "Qcur",
            "kqv_out",
            "attn_post_norm",
            "ffn_post_norm",
            "l_out",
        ] {
            assert!(
                names.contains(&(Some(il), name)),
                "missing {name} of layer {il}"
            );
        }
    }
    assert_eq!(result, logits);
}

#[test]
fn mean_nll_is_the_mean_of_next_token_log_losses() {
    let m = tiny_model("llama", TINY, &mut rng("nll"));
    let logits = all_logits(&m, &TOKENS);
    let want: Vec<f64> = (0..TOKENS.len() - 1)
        .map(|i| {
            let row = &logits[i * 50..(i + 1) * 50];
            let z: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
            z.ln() - row[TOKENS[i + 1] as usize] as f64
        })
        .collect();
    let got = token_nlls(&m, &TOKENS).unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-4, "{g} vs {w}");
    }
    let mean = mean_nll(&m, &TOKENS).unwrap();
    assert!((mean - want.iter().sum::<f64>() / 11.0).abs() < 1e-4);
}

#[test]
fn bad_batches_are_clear_errors() {
    let m = tiny_model("llama", TINY, &mut rng("bad_batches"));
    let mut s = m.session(8);
    let e = s.forward(&[1, 50, 2], 0, Logits::Last).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::TokenOutOfRange {
                id: 50,
                index: 1,
                n_vocab: 50
            }
        ),
        "{e}"
    );
    let e = s.forward(&[1; 9], 0, Logits::Last).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::ContextOverflow {
                needed: 9,
                n_ctx: 8
            }
        ),
        "{e}"
    );
    let e = s.forward(&[1], 3, Logits::Last).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::StartPastCache {
                start_pos: 3,
                cached: 0
            }
        ),
        "{e}"
    );
    assert!(matches!(
        s.forward(&[], 0, Logits::Last),
        Err(ModelError::EmptyBatch)
    ));
    assert!(mean_nll(&m, &[1]).is_err());
}
