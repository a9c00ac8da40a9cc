//! The CPU training step (`CpuTrainer`) against the f64 reference on tiny random models of
//! every trainable family: its loss equals the reference loss, its adapter gradients equal
//! central finite differences of the reference loss along random directions (each adapter's A
//! and B alone, then all at once), with and without dropout, keeping or recomputing the
//! activations; and where a GPU (or lavapipe) exists, the GPU step's gradients equal the CPU
//! step's.

use std::borrow::Cow;
use std::sync::Arc;

use octoflow_gguf::{quant, GgmlType, GgufFile};
use octoflow_kernels::{AdamWStep, IGNORE};
use octoflow_model::testing::{rng, tiny_writer, TinyShape, TINY};
use octoflow_model::Model;
use octoflow_train::reference::RefModel;
use octoflow_train::{Backend, CpuTrainer, LoraConfig, Rows, Target, TrainerOptions};
use rand::rngs::StdRng;
use rand::Rng;

/// A tiny random model of `arch` with its matrices in Q8_0 (a quantized frozen base).
fn tiny_q8(arch: &str, shape: TinyShape, rng: &mut StdRng) -> Model {
    let mut w = tiny_writer(arch, shape, rng);
    for t in w.tensors_mut() {
        if t.dims.len() == 2 && t.ty == GgmlType::F32 && t.dims[0] % 32 == 0 {
            let f: Vec<f32> = t
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let mut q = vec![0u8; quant::quantized_size(GgmlType::Q8_0, f.len()).unwrap()];
            quant::quantize(GgmlType::Q8_0, &f, &mut q).unwrap();
            t.ty = GgmlType::Q8_0;
            t.data = Cow::Owned(q);
        }
    }
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    Model::from_gguf(Arc::new(GgufFile::from_bytes(bytes).unwrap())).unwrap()
}

/// Rows per sequence.
const SEQ: usize = 6;

/// Three sequences of 6 rows; the second holds two documents, the third three; some rows
/// carry no loss, one a zero weight.
fn rows(rng: &mut StdRng, n_vocab: u32) -> Rows {
    let pos: Vec<u32> = [0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 3].to_vec();
    let n = pos.len();
    let ids: Vec<u32> = (0..n).map(|_| rng.gen_range(0..n_vocab)).collect();
    let labels: Vec<u32> = (0..n)
        .map(|i| {
            if i % 5 == 3 {
                IGNORE
            } else {
                rng.gen_range(0..n_vocab)
            }
        })
        .collect();
    let k = labels.iter().filter(|&&l| l != IGNORE).count() as f32;
    let mut weights: Vec<f32> = labels
        .iter()
        .map(|&l| if l == IGNORE { 0.0 } else { 1.0 / k })
        .collect();
    weights[7] = 0.0;
    Rows {
        ids,
        labels,
        weights,
        pos,
    }
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
    let model = tiny_q8(arch, TINY, &mut rng);
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
    // directional derivatives: each adapter's A and B alone, then everything at once
    // small: some directions are sharply curved (one measured f' 0.0771 where eps 1e-4 gave
    // 0.0770 and 1e-3 gave 0.062); f64 roundoff stays ~1e-11 at this step
    let eps = 1e-5;
    let tol = 5e-4;
    let mut dirs: Vec<Vec<f64>> = Vec::new();
    for e in &layout.entries {
        for (from, to) in [(e.a, e.b), (e.b, e.b + e.n_out * layout.rank)] {
            let mut u = vec![0.0; layout.n_params];
            for v in &mut u[from..to] {
                *v = rng.gen_range(-1.0..1.0);
            }
            dirs.push(u);
        }
    }
    dirs.push(
        (0..layout.n_params)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect(),
    );
    let mut worst = 0f64;
    for (i, u) in dirs.iter().enumerate() {
        let shifted = |s: f64| -> Vec<f64> { p64.iter().zip(u).map(|(p, d)| p + s * d).collect() };
        let loss_at =
            |s: f64| reference.loss_with_dropout(&layout, &shifted(s), &r, SEQ, dropout, seed);
        let fd = (loss_at(eps) - loss_at(-eps)) / (2.0 * eps);
        let gu: f64 = g.iter().zip(u).map(|(&a, b)| f64::from(a) * b).sum();
        let scale: f64 = u.iter().map(|d| d * d).sum::<f64>().sqrt();
        let err = (fd - gu).abs() / (fd.abs() + 1e-3 * scale);
        worst = worst.max(err);
        assert!(
            err < tol,
            "{name}: direction {i}: finite difference {fd:.6e}, CPU gradient {gu:.6e} (rel {err:.2e})"
        );
    }
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
    let model = tiny_q8("llama", TINY, &mut rng);
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
    let model = tiny_q8("llama", TINY, &mut r);
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
