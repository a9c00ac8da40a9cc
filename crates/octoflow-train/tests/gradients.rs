//! The whole training step against the CPU reference on tiny random models: the GPU loss
//! equals the f64 reference loss, and the GPU's adapter gradients equal central finite
//! differences of the reference loss along random directions (every adapter separately, and
//! all at once).

mod common;

use std::sync::Arc;

use octoflow_model::gpu::GpuModel;
use octoflow_model::testing::{rng, TINY};
use octoflow_train::reference::RefModel;
use octoflow_train::{LoraConfig, Rows, Target, Trainer, TrainerOptions};
use octoflow_vk::testing::gpu_or_skip;
use rand::rngs::StdRng;
use rand::Rng;

/// Rows per sequence: two sequences make 8 rows, kept below the row count where coopmat
/// devices switch the frozen projections to f16 tensor cores (`check_arch` sets that count to
/// 9), so the step is f32 on every device and the bounds stay tight.
const SEQ: usize = 4;

/// Two sequences of 4 rows; the second holds two documents; some rows carry no loss.
fn rows(rng: &mut StdRng, n_vocab: u32) -> Rows {
    common::random_rows(rng, n_vocab, vec![0, 1, 2, 3, 0, 1, 0, 1])
}

fn check_arch(arch: &str, dropout: f32) {
    // Finite differences want f32 products: the two 4-row sequences make batches of 8 rows,
    // which devices with cooperative matrices would multiply on f16 operands (from
    // `COOP_MIN_TOKENS` = 5 tokens up; there qwen2's worst direction exceeded 5e-2), or where
    // they accelerate 8-bit dot products on 8-bit codes of x (`Tuning::dot_batches`). Every
    // test here sets the same values before the first kernel is built.
    std::env::set_var("OCTOFLOW_COOP_MIN_TOKENS", "9");
    std::env::set_var("OCTOFLOW_DOT_BATCHES", "0");
    let Some(ctx) = gpu_or_skip(&format!("train_gradients_{arch}")) else {
        return;
    };
    let mut rng = rng(&format!("train_gradients_{arch}"));
    let model = common::tiny_q8(arch, TINY, &mut rng);
    let reference = RefModel::new(&model).unwrap();
    let gm = GpuModel::load(&ctx, &model).unwrap();
    assert!(
        !gm.kernels().linear.uses_coop(2 * SEQ as u32),
        "{arch}: the step's batches would run on f16 operands"
    );
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout,
        targets: Target::ALL.to_vec(),
    };
    let opts = TrainerOptions {
        batch: 2,
        seq_len: SEQ,
        lora,
    };
    let mut t = Trainer::new(gm, &opts).unwrap();
    let layout = t.layout().clone();
    // B nonzero too, so every gradient is exercised
    let p: Vec<f32> = (0..layout.n_params)
        .map(|_| rng.gen_range(-0.3..0.3))
        .collect();
    t.set_params(&p).unwrap();
    let r = rows(&mut rng, model.config.n_vocab as u32);
    let seed = 0x5eed;
    let loss = t.micro_step(&r, seed).unwrap();
    let g = t.grads().unwrap();
    let p64: Vec<f64> = p.iter().map(|&v| f64::from(v)).collect();
    let want = reference.loss_with_dropout(&layout, &p64, &r, SEQ, dropout, seed);
    let loss_tol = 1e-4;
    let rel = (loss - want).abs() / want.abs();
    assert!(
        rel < loss_tol,
        "{arch}: GPU loss {loss} vs reference {want} (rel {rel:.2e})"
    );
    // a second micro-step accumulates: gradients double
    let loss2 = t.micro_step(&r, seed).unwrap();
    let g2 = t.grads().unwrap();
    assert_eq!(loss, loss2, "{arch}: the replayed chain gives another loss");
    for (a, b) in g.iter().zip(&g2) {
        assert!(
            (2.0 * a - b).abs() <= 1e-5 * b.abs().max(1e-3),
            "{arch}: accumulation"
        );
    }
    let loss_at = |q: &[f64]| reference.loss_with_dropout(&layout, q, &r, SEQ, dropout, seed);
    let worst = common::check_directions(arch, &layout, &p64, &g, loss_at, &mut rng);
    // evaluation runs without dropout and leaves the gradients alone
    let ev = t.eval(&r).unwrap();
    let want0 = reference.loss(&layout, &p64, &r, SEQ);
    assert!(
        (ev - want0).abs() <= loss_tol * want0.abs(),
        "{arch}: eval loss {ev} vs the reference without dropout {want0}"
    );
    assert_eq!(t.grads().unwrap(), g2, "{arch}: eval touched the gradients");
    println!("{arch} (dropout {dropout}): loss {loss:.6} (reference {want:.6}), worst directional error {worst:.2e}");
}

#[test]
fn llama_gradients_match_finite_differences() {
    check_arch("llama", 0.0);
}

#[test]
fn qwen2_gradients_match_finite_differences() {
    check_arch("qwen2", 0.0);
}

#[test]
fn qwen3_gradients_match_finite_differences() {
    check_arch("qwen3", 0.0);
}

#[test]
fn gemma3_gradients_match_finite_differences() {
    check_arch("gemma3", 0.0);
}

#[test]
fn gradients_with_dropout_match_finite_differences() {
    // the reference applies the same counter-based masks (dropout_uniform, same seed and salts)
    check_arch("qwen2", 0.25);
}

/// gpt-oss's attention pieces run in the inference graph but not in the training step: the
/// trainer and the f64 reference refuse such a model by name instead of training without them.
#[test]
fn gpt_oss_attention_is_a_clear_error_for_training() {
    let Some(ctx) = gpu_or_skip("train_gpt_oss_attention_refused") else {
        return;
    };
    let mut r = rng("train_gpt_oss_attention_refused");
    let mut model = octoflow_model::testing::tiny_model("llama", TINY, &mut r);
    let n_head = model.config.n_head;
    model.config.blocks[1].attn.sinks = true;
    model.weights.blk[1].attn_sinks = Some(vec![0.5; n_head]);
    let e = RefModel::new(&model).err().expect("refused").to_string();
    assert!(e.contains("attention sinks"), "{e}");
    let gm = GpuModel::load(&ctx, &model).expect("the inference graph runs sinks");
    let opts = TrainerOptions {
        batch: 1,
        seq_len: SEQ,
        lora: LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.0,
            targets: Target::ALL.to_vec(),
        },
    };
    let e = Trainer::new(gm, &opts).err().expect("refused").to_string();
    assert!(
        e.contains("attention sinks") && e.contains("training step"),
        "{e}"
    );
}

/// The input gradients through f16 copies of `Wᵀ` (`Trainer::set_transposed`, the product
/// kernel of the forward) equal those through the quantized weights (`LinearT`) up to the
/// copies' f16 rounding (~5e-4 relative per weight); the loss, a forward quantity, is the same.
#[test]
fn gradients_through_transposed_copies_match_the_quantized_path() {
    std::env::set_var("OCTOFLOW_COOP_MIN_TOKENS", "9");
    std::env::set_var("OCTOFLOW_DOT_BATCHES", "0");
    let Some(ctx) = gpu_or_skip("train_gradients_transposed") else {
        return;
    };
    let mut rng = rng("train_gradients_transposed");
    let model = common::tiny_q8("qwen2", TINY, &mut rng);
    let gm = Arc::new(GpuModel::load(&ctx, &model).unwrap());
    let opts = TrainerOptions {
        batch: 2,
        seq_len: SEQ,
        lora: LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.0,
            targets: Target::ALL.to_vec(),
        },
    };
    let mut plain = Trainer::new(gm.clone(), &opts).unwrap();
    let mut fast = Trainer::new(gm, &opts).unwrap();
    let t = octoflow_train::TransposedWeights::build(&ctx, &model).unwrap();
    assert!(t.bytes() > 0);
    fast.set_transposed(Some(Arc::new(t))).unwrap();
    let n = plain.layout().n_params;
    let p: Vec<f32> = (0..n).map(|_| rng.gen_range(-0.3..0.3)).collect();
    plain.set_params(&p).unwrap();
    fast.set_params(&p).unwrap();
    let r = rows(&mut rng, model.config.n_vocab as u32);
    let (la, lb) = (
        plain.micro_step(&r, 1).unwrap(),
        fast.micro_step(&r, 1).unwrap(),
    );
    assert_eq!(la, lb, "the forward changed");
    let (ga, gb) = (plain.grads().unwrap(), fast.grads().unwrap());
    assert!(gb.iter().all(|v| v.is_finite()), "a gradient is not finite");
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let diff: Vec<f32> = ga.iter().zip(&gb).map(|(a, b)| a - b).collect();
    let rel = norm(&diff) / norm(&ga);
    assert!(rel < 3e-3, "gradients differ by {rel:.2e} of their norm");
    println!("transposed f16 copies: gradients within {rel:.2e} of the quantized path");
}

/// Batches long enough that the adapters' products are split along the rows they sum over
/// (`split_k` in `gpu/ops.rs`) give the loss and gradients of the CPU step (checked against
/// finite differences in `cpu_gradients.rs`) on the same micro-batch.
#[test]
fn long_batches_split_the_adapter_products_and_match_the_cpu_step() {
    std::env::set_var("OCTOFLOW_COOP_MIN_TOKENS", "9");
    std::env::set_var("OCTOFLOW_DOT_BATCHES", "0");
    let Some(ctx) = gpu_or_skip("train_gradients_split") else {
        return;
    };
    let mut rng = rng("train_gradients_split");
    let model = common::tiny_q8("llama", TINY, &mut rng);
    let gm = GpuModel::load(&ctx, &model).unwrap();
    let (batch, seq) = (4, 128);
    let opts = TrainerOptions {
        batch,
        seq_len: seq,
        lora: LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.1,
            targets: Target::ALL.to_vec(),
        },
    };
    let mut gpu = Trainer::new(gm, &opts).unwrap();
    let mut cpu = octoflow_train::CpuTrainer::new(&model, &opts).unwrap();
    let n = gpu.layout().n_params;
    let p: Vec<f32> = (0..n).map(|_| rng.gen_range(-0.3..0.3)).collect();
    gpu.set_params(&p).unwrap();
    octoflow_train::Backend::set_params(&mut cpu, &p).unwrap();
    let t = batch * seq;
    let nv = model.config.n_vocab as u32;
    // documents of 40 rows, every fifth row without a loss
    let pos = (0..t).map(|i| ((i % seq) % 40) as u32).collect();
    let r = common::random_rows(&mut rng, nv, pos);
    let lg = gpu.micro_step(&r, 9).unwrap();
    let lc = octoflow_train::Backend::micro_step(&mut cpu, &r, 9).unwrap();
    let (gg, gc) = (
        gpu.grads().unwrap(),
        octoflow_train::Backend::grads(&cpu).unwrap(),
    );
    // f32 products in different orders; f16 operands where the products run on tensor cores
    let tol = if gpu.uses_coop() { 2e-2 } else { 1e-4 };
    assert!(
        (lg - lc).abs() <= tol * lc.abs(),
        "loss: GPU {lg}, CPU {lc}"
    );
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let diff: Vec<f32> = gg.iter().zip(&gc).map(|(a, b)| a - b).collect();
    let rel = norm(&diff) / norm(&gc);
    assert!(
        gg.iter().all(|v| v.is_finite()) && rel < tol,
        "gradients differ by {rel:.2e}"
    );
    println!("{t} rows: GPU loss {lg:.6}, CPU {lc:.6}; gradients within {rel:.2e}");
}
