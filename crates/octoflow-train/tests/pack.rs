//! `pack` invariants on random examples, and `epoch_order` determinism.

use octoflow_train::{epoch_order, pack, Example, IGNORE};
use rand::{Rng, SeedableRng};

fn random_examples(rng: &mut impl Rng, n: usize, max_len: usize) -> Vec<Example> {
    (0..n)
        .map(|_| {
            let len = rng.gen_range(0..=max_len);
            Example {
                ids: (0..len).map(|_| rng.gen_range(0..50_000)).collect(),
                train: (0..len).map(|_| rng.gen_bool(0.6)).collect(),
            }
        })
        .collect()
}

/// Walks the packing the specification describes and checks every row of the output.
fn check(examples: &[Example], order: &[usize], seq_len: usize, pad: u32, seed: u64) {
    let (seqs, stats) = pack(examples, order, seq_len, pad);
    let ctx = format!("seed {seed}, seq_len {seq_len}");
    assert_eq!(stats.sequences, seqs.len(), "{ctx}");
    let (mut s, mut row) = (0usize, 0usize);
    let (mut truncated, mut trained, mut padding) = (0, 0, 0);
    let finish = |s: usize, row: usize, padding: &mut usize| {
        for r in row..seq_len {
            assert_eq!(seqs[s].ids[r], pad, "{ctx}: padding id");
            assert_eq!(seqs[s].labels[r], IGNORE, "{ctx}: padding label");
            assert_eq!(seqs[s].pos[r], 0, "{ctx}: padding pos");
            *padding += 1;
        }
    };
    for &i in order {
        let ex = &examples[i];
        if ex.ids.is_empty() {
            continue;
        }
        let n = ex.ids.len().min(seq_len);
        truncated += usize::from(ex.ids.len() > seq_len);
        if row + n > seq_len {
            finish(s, row, &mut padding);
            s += 1;
            row = 0;
        }
        let q = &seqs[s];
        for k in 0..n {
            assert_eq!(q.ids[row + k], ex.ids[k], "{ctx}: id");
            assert_eq!(q.pos[row + k], k as u32, "{ctx}: pos");
            let want = if k + 1 < n && ex.train[k + 1] {
                ex.ids[k + 1]
            } else {
                IGNORE
            };
            assert_eq!(q.labels[row + k], want, "{ctx}: label");
            trained += usize::from(want != IGNORE);
        }
        row += n;
    }
    if row > 0 {
        finish(s, row, &mut padding);
        s += 1;
    }
    assert_eq!(s, seqs.len(), "{ctx}: sequence count");
    for q in &seqs {
        assert_eq!(
            (q.ids.len(), q.labels.len(), q.pos.len()),
            (seq_len, seq_len, seq_len)
        );
    }
    assert_eq!(stats.truncated, truncated, "{ctx}");
    assert_eq!(stats.trained_tokens, trained, "{ctx}");
    assert_eq!(stats.padding, padding, "{ctx}");
}

#[test]
fn packing_invariants_on_random_examples() {
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for seq_len in [1, 2, 7, 16, 64, 257] {
        let examples = random_examples(&mut rng, 60, 80);
        let order = epoch_order(examples.len(), seed, 0);
        check(&examples, &order, seq_len, 0, seed);
        // an order that repeats and skips examples is followed as given
        let order: Vec<usize> = (0..90).map(|_| rng.gen_range(0..examples.len())).collect();
        check(&examples, &order, seq_len, 7, seed);
    }
}

#[test]
fn packing_by_hand() {
    let ex = |ids: &[u32], train: &[bool]| Example {
        ids: ids.to_vec(),
        train: train.to_vec(),
    };
    let examples = [
        ex(&[1, 10, 11, 12], &[false, false, true, true]),
        ex(&[1, 20, 21], &[false, true, true]),
        ex(&[1, 30, 31, 32, 33, 34, 35], &[true; 7]),
    ];
    let (seqs, stats) = pack(&examples, &[0, 1, 2], 6, 99);
    assert_eq!(stats.sequences, 3);
    assert_eq!(stats.truncated, 1);
    assert_eq!(seqs[0].ids, [1, 10, 11, 12, 99, 99]); // [1, 20, 21] does not fit in 2 rows
    assert_eq!(seqs[0].labels, [IGNORE, 11, 12, IGNORE, IGNORE, IGNORE]);
    assert_eq!(seqs[0].pos, [0, 1, 2, 3, 0, 0]);
    assert_eq!(seqs[1].ids, [1, 20, 21, 99, 99, 99]);
    assert_eq!(seqs[1].labels, [20, 21, IGNORE, IGNORE, IGNORE, IGNORE]);
    assert_eq!(seqs[2].ids, [1, 30, 31, 32, 33, 34]); // truncated to seq_len
    assert_eq!(seqs[2].labels, [30, 31, 32, 33, 34, IGNORE]);
    assert_eq!(seqs[2].pos, [0, 1, 2, 3, 4, 5]);
    assert_eq!(stats.trained_tokens, 2 + 2 + 5);
    assert_eq!(stats.padding, 2 + 3);
    // two examples that fit share a sequence, positions restarting
    let (seqs, _) = pack(&examples, &[1, 0], 8, 0);
    assert_eq!(seqs.len(), 1);
    assert_eq!(seqs[0].pos, [0, 1, 2, 0, 1, 2, 3, 0]);
    assert_eq!(
        seqs[0].labels[2], IGNORE,
        "an example's last row predicts nothing"
    );
    assert!(pack(&examples, &[0], 0, 0).0.is_empty());
}

#[test]
fn epoch_order_is_a_deterministic_permutation() {
    let seed: u64 = rand::random();
    for n in [0, 1, 2, 5, 100, 1001] {
        let a = epoch_order(n, seed, 3);
        assert_eq!(
            a,
            epoch_order(n, seed, 3),
            "seed {seed}: same inputs, same order"
        );
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..n).collect::<Vec<_>>(),
            "seed {seed}: a permutation"
        );
        if n >= 100 {
            assert_ne!(a, epoch_order(n, seed, 4), "seed {seed}: epochs differ");
            assert_ne!(a, epoch_order(n, seed ^ 1, 3), "seed {seed}: seeds differ");
            assert_ne!(a, (0..n).collect::<Vec<_>>(), "seed {seed}: shuffled");
        }
    }
    // pinned: the order must not change between builds (resuming depends on it)
    assert_eq!(epoch_order(8, 42, 0), [2, 6, 0, 7, 5, 4, 1, 3]);
}
