//! The CPU training step (`CpuTrainer`) against the f64 reference on tiny random models of
//! every trainable family: its loss equals the reference loss, its adapter gradients equal
//! central finite differences of the reference loss along random directions (each adapter's A
//! and B alone, then all at once), with and without dropout, keeping or recomputing the
//! activations; and where a GPU (or lavapipe) exists, the GPU step's gradients equal the CPU
//! step's.

mod common;

use octoflow_kernels::AdamWStep;
use octoflow_model::testing::{rng, TINY};
use octoflow_train::reference::RefModel;
use octoflow_train::{Backend, CpuTrainer, LoraConfig, Rows, Target, TrainerOptions};
use rand::rngs::StdRng;
use rand::Rng;

/// Rows per sequence.
const SEQ: usize = 6;

/// Three sequences of 6 rows; the second holds two documents, the third three; some rows
/// carry no loss, one a zero weight.
fn rows(rng: &mut StdRng, n_vocab: u32) -> Rows {
    let pos = vec![0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 3];
    let mut r = common::random_rows(rng, n_vocab, pos);
    r.weights[7] = 0.0;
    r
}

fn lora(dropout: f32) -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout,
        targets: Target::ALL.to_vec(),
    }
}

fn opts(dropout: f32) -> TrainerOptions {
    TrainerOptions {
        batch: 3,
        seq_len: SEQ,
        lora: lora(dropout),
    }
}

/// Random adapters (B nonzero too, so every gradient is exercised).
fn params(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-0.3..0.3)).collect()
}

fn check_arch(arch: &str, dropout: f32, keep: bool) {
    let name = format!("cpu_train_gradients_{arch}_{dropout}_{keep}");
    let mut rng = rng(&name);
    let model = common::tiny_q8(arch, TINY, &mut rng);
    let reference = RefModel::new(&model).unwrap();
    let mut t = CpuTrainer::new(&model, &opts(dropout)).unwrap();
    t.set_keep_activations(keep);
    let layout = t.layout().clone();
    let p = params(&mut rng, layout.n_params);
    t.set_params(&p).unwrap();
    let r = rows(&mut rng, model.config.n_vocab as u32);
    let seed = 0x5eed;
    let loss = t.micro_step(&r, seed).unwrap();
    let g = t.grads().unwrap();
    assert!(
        g.iter().all(|v| v.is_finite()),
        "{name}: a gradient is not finite"
    );
    let p64: Vec<f64> = p.iter().map(|&v| f64::from(v)).collect();
    let want = reference.loss_with_dropout(&layout, &p64, &r, SEQ, dropout, seed);
    let rel = (loss - want).abs() / want.abs();
    assert!(
        rel < 1e-4,
        "{name}: CPU loss {loss} vs reference {want} (rel {rel:.2e})"
    );
    // a second micro-step accumulates: gradients double
    let loss2 = t.micro_step(&r, seed).unwrap();
    assert_eq!(
        loss, loss2,
        "{name}: the same micro-batch gave another loss"
    );
    let g2 = t.grads().unwrap();
    for (a, b) in g.iter().zip(&g2) {
        assert!(
            (2.0 * a - b).abs() <= 1e-5 * b.abs().max(1e-3),
            "{name}: accumulation"
        );
    }
    let loss_at = |q: &[f64]| reference.loss_with_dropout(&layout, q, &r, SEQ, dropout, seed);
    let worst = common::check_directions(&name, &layout, &p64, &g, loss_at, &mut rng);
    // evaluation is the loss without dropout and leaves the gradients alone
    let ev = t.eval(&r).unwrap();
    let want0 = reference.loss(&layout, &p64, &r, SEQ);
    assert!(
        (ev - want0).abs() <= 1e-4 * want0.abs(),
        "{name}: eval {ev} vs {want0}"
    );
    assert_eq!(t.grads().unwrap(), g2, "{name}: eval touched the gradients");
    println!("{name}: loss {loss:.6} (reference {want:.6}), worst directional error {worst:.2e}");
}

#[test]
fn llama_cpu_gradients_match_finite_differences() {
    check_arch("llama", 0.0, true);
}

#[test]
fn qwen2_cpu_gradients_match_finite_differences() {
    check_arch("qwen2", 0.0, true);
}

#[test]
fn qwen3_cpu_gradients_match_finite_differences() {
    check_arch("qwen3", 0.0, true);
}

#[test]
fn gemma3_cpu_gradients_match_finite_differences() {
    // sliding-window layers, per-head norms, post-norms, gelu, embedding scale
    check_arch("gemma3", 0.0, true);
}

#[test]
fn phi3_cpu_gradients_match_finite_differences() {
    check_arch("phi3", 0.0, true);
}

#[test]
fn cpu_gradients_with_dropout_and_recomputed_activations_match() {
    check_arch("qwen2", 0.25, true);
    check_arch("llama", 0.25, false);
}

/// One optimizer step is AdamW with global-norm clipping over the accumulated gradients,
/// which it zeroes: the parameters move as `adamw_ref` moves them.
#[test]
fn the_optimizer_step_is_adamw_over_the_accumulated_gradients() {
    let mut rng = rng("cpu_train_adamw");
    let model = common::tiny_q8("llama", TINY, &mut rng);
    let mut t = CpuTrainer::new(&model, &opts(0.0)).unwrap();
    let n = t.layout().n_params;
    let p = params(&mut rng, n);
    t.set_params(&p).unwrap();
    let r = rows(&mut rng, model.config.n_vocab as u32);
    t.micro_step(&r, 1).unwrap();
    let mut g = t.grads().unwrap();
    let step = AdamWStep {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 1,
        max_grad_norm: 1e-3,
        grad_scale: 1.0,
        zero_grads: true,
    };
    let norm = t.optimizer_step(&step).unwrap();
    let ss: f64 = g.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    assert!(
        (f64::from(norm) - ss.sqrt()).abs() <= 1e-5 * ss.sqrt(),
        "norm {norm}"
    );
    assert!(f64::from(norm) > 1e-3, "the test wants clipping to act");
    let (mut want, mut m, mut v) = (p.clone(), vec![0f32; n], vec![0f32; n]);
    octoflow_kernels::adamw_ref(
        &mut want,
        &mut g,
        &mut m,
        &mut v,
        f64::from(ss as f32),
        &step,
    );
    assert_eq!(t.params().unwrap(), want);
    assert!(
        t.grads().unwrap().iter().all(|&v| v == 0.0),
        "gradients not zeroed"
    );
    let (tm, tv) = t.moments().unwrap();
    assert_eq!((tm, tv), (m, v));
}

/// Bad micro-batches and models the step does not run are clear errors, not panics.
#[test]
fn bad_rows_and_untrainable_models_are_clear_errors() {
    let mut r = rng("cpu_train_bad_rows");
    let model = common::tiny_q8("llama", TINY, &mut r);
    let mut t = CpuTrainer::new(&model, &opts(0.0)).unwrap();
    let mut rows = rows(&mut r, model.config.n_vocab as u32);
    rows.ids[3] = model.config.n_vocab as u32;
    let e = t.micro_step(&rows, 0).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    rows.ids.pop();
    let e = t.eval(&rows).unwrap_err().to_string();
    assert!(e.contains("micro-batch ids"), "{e}");
    let e = t.set_params(&[0.0; 3]).unwrap_err().to_string();
    assert!(e.contains("3 values given"), "{e}");
    let mut model = octoflow_model::testing::tiny_model("llama", TINY, &mut r);
    let n_head = model.config.n_head;
    model.config.blocks[1].attn.sinks = true;
    model.weights.blk[1].attn_sinks = Some(vec![0.5; n_head]);
    let e = CpuTrainer::new(&model, &opts(0.0))
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("attention sinks") && e.contains("training step"),
        "{e}"
    );
}
