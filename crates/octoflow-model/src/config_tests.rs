//! Hyper-parameters and weight binding from metadata: what is read, and the errors for what is
//! missing or wrong.

use std::sync::Arc;

use octoflow_gguf::value::Value;
use octoflow_gguf::GgufWriter;

use crate::testing::{open, rng, tiny_writer, TINY};
use crate::{Activation, AttnKind, ModelConfig, ModelError, ModelWeights, RopeType};

fn config(w: &GgufWriter) -> crate::Result<ModelConfig> {
    ModelConfig::from_gguf(&open(w).expect("parses"))
}

fn bind(w: &GgufWriter) -> crate::Result<ModelWeights> {
    let file = Arc::new(open(w).expect("parses"));
    let c = ModelConfig::from_gguf(&file)?;
    ModelWeights::from_gguf(&file, &c)
}

#[test]
fn every_hyper_parameter_comes_from_metadata() {
    let c = config(&tiny_writer("llama", TINY, &mut rng("config_llama"))).unwrap();
    assert_eq!((c.n_layer, c.n_embd, c.n_ff), (2, 32, 64));
    assert_eq!(
        (c.n_head, c.n_head_kv, c.head_dim, c.n_vocab),
        (4, 2, 16, 50)
    );
    assert_eq!((c.n_rot, c.gqa_group(), c.blocks.len()), (16, 2, 2));
    for b in &c.blocks {
        let a = &b.attn;
        assert_eq!(
            (a.rope.kind, a.rope.base, a.scale),
            (RopeType::Normal, 10_000.0, 0.25)
        );
        assert_eq!(a.kind, AttnKind::Full);
        assert!(!a.qkv_bias && !a.qk_norm && !a.post_norm && !b.glu().unwrap().post_norm);
        assert_eq!(b.glu().unwrap().act, Activation::Silu);
    }
    let q = config(&tiny_writer("qwen2", TINY, &mut rng("config_qwen2"))).unwrap();
    let a = &q.blocks[0].attn;
    assert_eq!((a.rope.kind, a.qkv_bias), (RopeType::Neox, true));
}

#[test]
fn unsupported_architecture_is_named_with_the_supported_list() {
    let mut w = tiny_writer("llama", TINY, &mut rng("config_arch"));
    w.set("general.architecture", Value::String("mamba".into()));
    let e = config(&w).unwrap_err().to_string();
    assert!(
        e.contains("\"mamba\"")
            && e.contains("llama, qwen2, qwen3, qwen3moe, gemma3, phi3, gpt-oss"),
        "{e}"
    );
}

#[test]
fn missing_key_is_named() {
    let mut w = tiny_writer("qwen2", TINY, &mut rng("config_missing"));
    w.remove("qwen2.feed_forward_length");
    let e = config(&w).unwrap_err().to_string();
    assert!(e.contains("qwen2.feed_forward_length"), "{e}");
}

#[test]
fn heads_that_do_not_divide_are_refused() {
    let mut w = tiny_writer("llama", TINY, &mut rng("config_heads"));
    w.set("llama.attention.head_count_kv", Value::U32(3));
    let e = config(&w).unwrap_err();
    assert!(
        matches!(e, ModelError::BadHyperParameter { ref key, .. } if key == "llama.attention.head_count_kv"),
        "{e}"
    );
}

#[test]
fn rope_scaling_linear_sets_the_scale_yarn_adds_its_terms_longrope_is_refused() {
    let mut w = tiny_writer("llama", TINY, &mut rng("config_rope_scaling"));
    w.set("llama.rope.scaling.type", Value::String("linear".into()));
    w.set("llama.rope.scaling.factor", Value::F32(4.0));
    let rope = config(&w).unwrap().blocks[0].attn.rope;
    assert_eq!((rope.scale, rope.yarn), (0.25, None));
    // YaRN as llama.cpp sets it up: corr dims from the original context, mscale 1 + 0.1 ln 4
    w.set("llama.rope.scaling.type", Value::String("yarn".into()));
    w.set("llama.rope.scaling.original_context_length", Value::U32(64));
    let rope = config(&w).unwrap().blocks[0].attn.rope;
    let y = rope.yarn.expect("yarn terms");
    assert_eq!(rope.scale, 0.25);
    assert!((y.mscale - (1.0 + 0.1 * 4f32.ln())).abs() < 1e-6, "{y:?}");
    // n_rot 16, base 1e4, 64 positions: beta_fast 32 turns below pair 0 (floor 0), beta_slow
    // 1 at 16 ln(64 / 2π) / (2 ln 1e4) = 2.02 (ceil 3)
    assert_eq!((y.low, y.high), (0.0, 3.0), "{y:?}");
    let mix: Vec<f32> = (0..5).map(|i| y.mix(i)).collect();
    let want = [1.0, 2.0 / 3.0, 1.0 / 3.0, 0.0, 0.0];
    assert!(
        mix.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6),
        "{mix:?}"
    );
    w.set("llama.rope.scaling.type", Value::String("longrope".into()));
    let e = config(&w).unwrap_err().to_string();
    assert!(
        e.contains("llama.rope.scaling.type") && e.contains("longrope"),
        "{e}"
    );
}

#[test]
fn gemma3_has_five_local_layers_then_one_global() {
    let shape = crate::testing::TinyShape {
        n_layer: 12,
        ..TINY
    };
    let mut w = tiny_writer("gemma3", shape, &mut rng("config_gemma3"));
    w.set("gemma3.rope.freq_base", Value::F32(1_000_000.0));
    let c = config(&w).unwrap();
    for (il, b) in c.blocks.iter().enumerate() {
        let (a, global) = (&b.attn, il == 5 || il == 11);
        let kind = if global {
            AttnKind::Full
        } else {
            AttnKind::SlidingWindow(4)
        };
        assert_eq!(a.kind, kind, "layer {il}");
        let base = if global { 1_000_000.0 } else { 10_000.0 };
        assert_eq!(a.rope.base, base, "layer {il}");
        assert_eq!(a.scale, 0.25); // 1/sqrt(head_dim 16)
        assert!(
            a.qk_norm && a.post_norm && b.glu().unwrap().post_norm && a.rope.kind == RopeType::Neox
        );
        assert_eq!(b.glu().unwrap().act, Activation::GeluTanh);
    }
    assert_eq!(c.embedding_scale, (32f32).sqrt());
}

#[test]
fn gemma3_without_a_sliding_window_is_a_clear_error() {
    let mut w = tiny_writer("gemma3", TINY, &mut rng("config_gemma3_window"));
    w.remove("gemma3.attention.sliding_window");
    let e = config(&w).unwrap_err().to_string();
    assert!(e.contains("gemma3.attention.sliding_window"), "{e}");
}

#[test]
fn wrong_tensor_shape_names_the_tensor_and_both_shapes() {
    let mut w = tiny_writer("llama", TINY, &mut rng("weights_shape"));
    w.set("llama.feed_forward_length", Value::U32(48));
    let e = bind(&w).unwrap_err();
    assert!(
        matches!(&e, ModelError::TensorShape { name, expected, found }
            if name == "blk.0.ffn_gate.weight" && expected == &[32, 48] && found == &[32, 64]),
        "{e}"
    );
}

#[test]
fn qwen2_requires_its_qkv_biases() {
    let mut w = tiny_writer("qwen2", TINY, &mut rng("weights_bias"));
    w.tensors_mut().retain(|t| t.name != "blk.1.attn_k.bias");
    let e = bind(&w).unwrap_err().to_string();
    assert!(
        e.contains("blk.1.attn_k.bias") && e.contains("qwen2"),
        "{e}"
    );
}

#[test]
fn a_file_without_output_ties_it_to_token_embd() {
    let b = bind(&tiny_writer("llama", TINY, &mut rng("weights_tied"))).unwrap();
    assert!(b.output_is_tied);
    assert_eq!(b.output.name, "token_embd.weight");
    assert_eq!((b.output.n_rows, b.output.n_cols), (50, 32));
}

#[test]
fn phi3_fused_matrices_split_into_the_llama_blocks_views() {
    let w = tiny_writer("phi3", TINY, &mut rng("weights_phi3"));
    let b = bind(&w).unwrap();
    let (q, kv) = (TINY.n_head * TINY.head_dim, TINY.n_head_kv * TINY.head_dim);
    let l = &b.blk[1];
    assert_eq!(
        (l.attn_q.n_rows, l.attn_k.n_rows, l.attn_v.n_rows),
        (q, kv, kv)
    );
    let g = l.glu().unwrap();
    assert_eq!((g.ffn_gate.n_rows, g.ffn_up.n_rows), (TINY.n_ff, TINY.n_ff));
    // the views are consecutive rows of the fused tensors
    let row = l.attn_q.row_bytes();
    let file = open(&w).unwrap();
    let fused = file.tensor("blk.1.attn_qkv.weight").unwrap();
    let bytes = file.tensor_data(fused);
    assert_eq!(l.attn_k.row(0), &bytes[q * row..(q + 1) * row]);
    assert_eq!(
        l.attn_v.row(kv - 1),
        &bytes[(q + 2 * kv - 1) * row..(q + 2 * kv) * row]
    );
    let up = file.tensor_data(file.tensor("blk.1.ffn_up.weight").unwrap());
    let urow = g.ffn_up.row_bytes();
    assert_eq!(g.ffn_gate.row(0), &up[..urow]);
    assert_eq!(
        g.ffn_up.row(0),
        &up[TINY.n_ff * urow..(TINY.n_ff + 1) * urow]
    );
}

#[test]
fn phi3_with_a_short_fused_qkv_names_the_tensor() {
    let mut w = tiny_writer("phi3", TINY, &mut rng("weights_phi3_short"));
    let e = TINY.n_embd as u64;
    w.tensors_mut()
        .retain(|t| t.name != "blk.0.attn_qkv.weight");
    w.add_tensor(
        "blk.0.attn_qkv.weight",
        octoflow_gguf::GgmlType::F32,
        &[e, 8],
        vec![0u8; 4 * 8 * e as usize],
    )
    .unwrap();
    let e = bind(&w).unwrap_err().to_string();
    assert!(e.contains("blk.0.attn_qkv.weight"), "{e}");
}

#[test]
fn phi3_longrope_factors_follow_the_run_context_and_the_attention_factor_scales_cos_and_sin() {
    let mut w = tiny_writer("phi3", TINY, &mut rng("config_phi3_longrope"));
    let half = TINY.head_dim / 2;
    let factors = |v: f32| -> Vec<u8> { (0..half).flat_map(|_| v.to_le_bytes()).collect() };
    w.add_tensor(
        "rope_factors_long.weight",
        octoflow_gguf::GgmlType::F32,
        &[half as u64],
        factors(4.0),
    )
    .unwrap();
    w.add_tensor(
        "rope_factors_short.weight",
        octoflow_gguf::GgmlType::F32,
        &[half as u64],
        factors(1.5),
    )
    .unwrap();
    w.set("phi3.rope.scaling.original_context_length", Value::U32(64));
    w.set("phi3.rope.scaling.attn_factor", Value::F32(1.25));
    let c = config(&w).unwrap();
    assert_eq!(c.n_ctx_orig, 64);
    // the attention factor alone: no blend (mix 0), cos and sin times 1.25
    let y = c.blocks[0].attn.rope.yarn.expect("attention factor terms");
    assert_eq!((y.mscale, y.mix(0), y.mix(5)), (1.25, 0.0, 0.0));
    let weights = bind(&w).unwrap();
    assert_eq!(
        weights.rope_factors(64, c.n_ctx_orig),
        Some(&[1.5; 8][..half])
    );
    assert_eq!(
        weights.rope_factors(65, c.n_ctx_orig),
        Some(&[4.0; 8][..half])
    );
    // a factor table of the wrong length names the tensor
    let mut bad = tiny_writer("phi3", TINY, &mut rng("config_phi3_longrope_bad"));
    bad.add_tensor(
        "rope_factors_long.weight",
        octoflow_gguf::GgmlType::F32,
        &[half as u64 + 1],
        factors(4.0)
            .into_iter()
            .chain([0u8; 4])
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let e = bind(&bad).unwrap_err().to_string();
    assert!(e.contains("rope_factors_long.weight"), "{e}");
    // a non-positive attention factor is refused by name
    w.set("phi3.rope.scaling.attn_factor", Value::F32(0.0));
    let e = config(&w).unwrap_err().to_string();
    assert!(e.contains("rope.scaling.attn_factor"), "{e}");
}
