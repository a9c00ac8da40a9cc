//! Several trainers over one upload of the base (`Arc<GpuModel>`): micro-steps of two trainers
//! in flight at once (on two queues where the device has them) give each trainer exactly the
//! loss and gradients it gets alone; the submit/finish bookkeeping rejects misuse.

use std::sync::Arc;

use octoflow_kernels::IGNORE;
use octoflow_model::gpu::GpuModel;
use octoflow_model::testing::{rng, tiny_model, TINY};
use octoflow_train::{LoraConfig, Rows, Target, TrainError, Trainer, TrainerOptions};
use octoflow_vk::testing::gpu_or_skip;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One sequence of `seq` rows with random ids and labels (a few ignored).
fn rows(rng: &mut StdRng, seq: usize, n_vocab: u32) -> Rows {
    let labels: Vec<u32> = (0..seq)
        .map(|i| {
            if i % 3 == 2 {
                IGNORE
            } else {
                rng.gen_range(0..n_vocab)
            }
        })
        .collect();
    let n = labels.iter().filter(|&&l| l != IGNORE).count() as f32;
    Rows {
        ids: (0..seq).map(|_| rng.gen_range(0..n_vocab)).collect(),
        weights: labels
            .iter()
            .map(|&l| if l == IGNORE { 0.0 } else { 1.0 / n })
            .collect(),
        labels,
        pos: (0..seq as u32).collect(),
    }
}

fn opts(rank: usize, seq: usize) -> TrainerOptions {
    TrainerOptions {
        batch: 1,
        seq_len: seq,
        lora: LoraConfig {
            rank,
            alpha: 2.0 * rank as f32,
            dropout: 0.1,
            targets: Target::ALL.to_vec(),
        },
    }
}

/// Random nonzero adapters (B too, so every gradient is exercised).
fn randomize(t: &Trainer, rng: &mut StdRng) {
    let p: Vec<f32> = (0..t.layout().n_params)
        .map(|_| rng.gen_range(-0.3..0.3))
        .collect();
    t.set_params(&p).expect("params");
}

#[test]
fn two_trainers_over_one_model_in_flight_together_match_each_alone() {
    let Some(ctx) = gpu_or_skip("two_trainers_over_one_model") else {
        return;
    };
    let mut r = rng("two_trainers_over_one_model");
    let model = tiny_model("llama", TINY, &mut r);
    let n_vocab = model.config.n_vocab as u32;
    let gm = Arc::new(GpuModel::load(&ctx, &model).expect("upload"));
    let (seq_a, seq_b) = (8, 6);
    let (ra, rb) = (rows(&mut r, seq_a, n_vocab), rows(&mut r, seq_b, n_vocab));
    let (sa, sb): (u32, u32) = (r.gen(), r.gen());
    let state_a: u64 = r.gen();
    let state_b: u64 = r.gen();

    // alone, one after the other
    let mut alone = Vec::new();
    for (rank, seq, rows, seed, state) in
        [(4, seq_a, &ra, sa, state_a), (8, seq_b, &rb, sb, state_b)]
    {
        let mut t = Trainer::new(gm.clone(), &opts(rank, seq)).expect("trainer");
        randomize(&t, &mut StdRng::seed_from_u64(state));
        let loss = t.micro_step(rows, seed).expect("micro-step");
        alone.push((loss, t.grads().expect("grads")));
    }

    // together: both submitted before either is waited for, on queues 0 and 1
    let mut a = Trainer::new(gm.clone(), &opts(4, seq_a)).expect("trainer a");
    let mut b = Trainer::new(gm.clone(), &opts(8, seq_b)).expect("trainer b");
    assert_eq!(
        Arc::strong_count(&gm),
        3,
        "one upload shared by both trainers"
    );
    a.set_queue(0).expect("queue");
    b.set_queue(1).expect("queue");
    assert_eq!(b.queue(), 1 % ctx.queue_count());
    randomize(&a, &mut StdRng::seed_from_u64(state_a));
    randomize(&b, &mut StdRng::seed_from_u64(state_b));
    for _ in 0..2 {
        a.submit_micro(&ra, sa).expect("submit a");
        b.submit_micro(&rb, sb).expect("submit b");
        assert!(a.is_pending() && b.is_pending());
        let lb = b.finish_micro().expect("finish b");
        let la = a.finish_micro().expect("finish a");
        assert_eq!(la, alone[0].0, "run a's loss changed with b in flight");
        assert_eq!(lb, alone[1].0, "run b's loss changed with a in flight");
    }
    // two accumulated micro-steps: twice the gradients of one
    for (t, (_, g), name) in [(&a, &alone[0], "a"), (&b, &alone[1], "b")] {
        let got = t.grads().expect("grads");
        for (i, (x, y)) in got.iter().zip(g).enumerate() {
            assert!(
                (x - 2.0 * y).abs() <= 1e-6 * y.abs().max(1e-6),
                "run {name} gradient {i}: {x} vs 2 × {y}"
            );
        }
    }
    assert!(a.state_bytes() > 0 && a.state_bytes() < b.state_bytes());

    // bookkeeping: one micro-step in flight per trainer, finish needs a submit
    a.submit_micro(&ra, sa).expect("submit");
    let err = a.submit_micro(&ra, sa).unwrap_err();
    assert!(matches!(err, TrainError::Config(_)), "{err}");
    a.finish_micro().expect("finish");
    let err = a.finish_micro().unwrap_err();
    assert!(err.to_string().contains("no micro-step"), "{err}");
    // rows of another trainer's shape are rejected before anything is submitted
    assert!(a.submit_micro(&rb, sb).is_err());
    assert!(!a.is_pending());
}
