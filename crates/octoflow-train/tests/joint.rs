//! Several fine-tunes as the members of one trainer (`Trainer::joint`): one chain runs them
//! all, their rows stacked in the frozen products. Each member's loss and gradients must be
//! those it gets trained alone — with different ranks, targets, dropout, batch sizes and
//! sequence lengths (the shorter padded) — and a member that sits a step out must be left
//! untouched.

mod common;

use std::sync::Arc;

use common::random_rows;
use octoflow_kernels::AdamWStep;
use octoflow_model::gpu::GpuModel;
use octoflow_model::testing::{rng, tiny_model, TINY};
use octoflow_train::{LoraConfig, Rows, Target, Trainer, TrainerOptions};
use octoflow_vk::testing::gpu_or_skip;
use rand::rngs::StdRng;
use rand::Rng;

/// `batch` sequences of `seq` rows (`common::random_rows`), two documents in the first
/// sequence so attention's document bounds are exercised too.
fn rows(rng: &mut StdRng, batch: usize, seq: usize, n_vocab: u32) -> Rows {
    let pos = (0..batch * seq)
        .map(|i| {
            let (s, t) = (i / seq, i % seq);
            if s == 0 && t >= seq / 2 {
                (t - seq / 2) as u32
            } else {
                t as u32
            }
        })
        .collect();
    random_rows(rng, n_vocab, pos)
}

fn member(batch: usize, seq_len: usize, rank: usize, dropout: f32, t: &[Target]) -> TrainerOptions {
    TrainerOptions {
        batch,
        seq_len,
        lora: LoraConfig {
            rank,
            alpha: 2.0 * rank as f32,
            dropout,
            targets: t.to_vec(),
        },
    }
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.0, "{what}: all zero");
    for (i, (x, y)) in got.iter().zip(want).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * scale,
            "{what}[{i}]: {x} joint vs {y} alone (scale {scale})"
        );
    }
}

#[test]
fn members_of_one_trainer_get_what_each_gets_alone() {
    let Some(ctx) = gpu_or_skip("members_of_one_trainer") else {
        return;
    };
    let mut r = rng("members_of_one_trainer");
    let model = tiny_model("llama", TINY, &mut r);
    let n_vocab = model.config.n_vocab as u32;
    let gm = Arc::new(GpuModel::load(&ctx, &model).expect("upload"));
    // different shapes, adapters and dropout; the third is shorter (padded in the stack) and
    // has dropout with one sequence, so its masks are the ones it draws alone
    let opts = [
        member(2, 8, 4, 0.1, &Target::ALL),
        member(1, 8, 8, 0.0, &[Target::Q, Target::V, Target::Down]),
        member(
            1,
            5,
            2,
            0.2,
            &[Target::K, Target::O, Target::Gate, Target::Up],
        ),
    ];
    let micro: Vec<Rows> = opts
        .iter()
        .map(|o| rows(&mut r, o.batch, o.seq_len, n_vocab))
        .collect();
    let seeds: Vec<u32> = opts.iter().map(|_| r.gen()).collect();
    let params: Vec<Vec<f32>> = opts
        .iter()
        .map(|o| {
            let t = Trainer::new(gm.clone(), o).expect("trainer");
            (0..t.layout().n_params)
                .map(|_| r.gen_range(-0.3..0.3))
                .collect()
        })
        .collect();
    let step = AdamWStep {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 1,
        max_grad_norm: 1.0,
        grad_scale: 1.0,
        zero_grads: true,
    };

    // alone: a micro-step, an evaluation, an optimizer step
    let mut alone = Vec::new();
    for (i, o) in opts.iter().enumerate() {
        let mut t = Trainer::new(gm.clone(), o).expect("trainer");
        t.set_params(&params[i]).expect("params");
        let loss = t.micro_step(&micro[i], seeds[i]).expect("micro-step");
        let grads = t.grads().expect("grads");
        let eval = t.eval(&micro[i]).expect("eval");
        let norm = t.optimizer_step(&step).expect("optimizer");
        alone.push((loss, grads, eval, norm, t.params().expect("params")));
    }

    let mut j = Trainer::joint(gm.clone(), &opts).expect("joint trainer");
    assert_eq!(j.members(), 3);
    assert_eq!(j.stacked_rows(), 4 * 8, "the short member padded to 8 rows");
    for (g, p) in params.iter().enumerate() {
        j.set_params_of(g, p).expect("params");
    }
    for (g, m) in micro.iter().enumerate() {
        j.stage(g, m, seeds[g]).expect("stage");
    }
    j.submit_staged().expect("submit");
    assert!(j.is_pending());
    // taken out of order: every member's loss waits for the same step
    for g in [2, 0, 1] {
        let (loss, grads, ..) = &alone[g];
        let got = j.take_loss(g).expect("loss");
        assert!(
            (got - loss).abs() <= 1e-5 * loss.abs(),
            "member {g}: loss {got} joint vs {loss} alone"
        );
        close(
            &format!("member {g} gradients"),
            &j.grads_of(g).expect("grads"),
            grads,
        );
    }
    for g in 0..3 {
        let (_, _, eval, norm, after) = &alone[g];
        let e = j.eval_of(g, &micro[g]).expect("eval");
        assert!(
            (e - eval).abs() <= 1e-5 * eval.abs(),
            "member {g}: eval {e} vs {eval}"
        );
        let n = j.optimizer_step_of(g, &step).expect("optimizer");
        assert!(
            (n - norm).abs() <= 1e-4 * norm,
            "member {g}: norm {n} vs {norm}"
        );
        close(
            &format!("member {g} after AdamW"),
            &j.params_of(g).expect("params"),
            after,
        );
    }

    // member 1 sits the next step out: its gradients stay zero, the others' match a step of
    // their own again
    for g in [0, 2] {
        j.stage(g, &micro[g], seeds[g]).expect("stage");
    }
    j.submit_staged().expect("submit");
    for g in [0, 2] {
        j.take_loss(g).expect("loss");
    }
    assert!(j.grads_of(1).expect("grads").iter().all(|&x| x == 0.0));
    assert!(j.take_loss(1).is_err(), "member 1 had no micro-step");

    // misuse: a shape of another member, an unknown member, a submit with nothing staged
    assert!(j.stage(0, &micro[1], 1).is_err());
    assert!(j.stage(3, &micro[0], 1).is_err());
    assert!(j.submit_staged().is_err());
    assert!(!j.is_pending());
    assert!(Trainer::joint(gm, &[]).is_err());
}
