//! Hyper-parameters and weight binding from metadata: what is read, and the errors for what is
//! missing or wrong.

use std::sync::Arc;

use octoflow_gguf::value::Value;
use octoflow_gguf::GgufWriter;

use crate::testing::{open, rng, tiny_writer, TINY};
use crate::{ModelConfig, ModelError, ModelWeights, RopeType};

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
    assert_eq!(
        (c.rope_type, c.n_rot, c.gqa_group()),
        (RopeType::Normal, 16, 2)
    );
    assert_eq!(c.attention_scale, 0.25);
    assert!(c
        .layers
        .iter()
        .all(|l| l.sliding_window.is_none() && l.rope_base == 10_000.0));
    let q = config(&tiny_writer("qwen2", TINY, &mut rng("config_qwen2"))).unwrap();
    assert_eq!((q.rope_type, q.qkv_bias), (RopeType::Neox, true));
}

#[test]
fn unsupported_architecture_is_named_with_the_supported_list() {
    let mut w = tiny_writer("llama", TINY, &mut rng("config_arch"));
    w.set("general.architecture", Value::String("mamba".into()));
    let e = config(&w).unwrap_err().to_string();
    assert!(
        e.contains("\"mamba\"") && e.contains("llama, qwen2, gemma3"),
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
fn linear_rope_scaling_sets_the_position_scale_and_yarn_is_refused() {
    let mut w = tiny_writer("llama", TINY, &mut rng("config_rope_scaling"));
    w.set("llama.rope.scaling.type", Value::String("linear".into()));
    w.set("llama.rope.scaling.factor", Value::F32(4.0));
    assert_eq!(config(&w).unwrap().layers[0].rope_scale, 0.25);
    w.set("llama.rope.scaling.type", Value::String("yarn".into()));
    let e = config(&w).unwrap_err().to_string();
    assert!(
        e.contains("llama.rope.scaling.type") && e.contains("yarn"),
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
    for (il, l) in c.layers.iter().enumerate() {
        let global = il == 5 || il == 11;
        assert_eq!(
            l.sliding_window,
            if global { None } else { Some(4) },
            "layer {il}"
        );
        assert_eq!(
            l.rope_base,
            if global { 1_000_000.0 } else { 10_000.0 },
            "layer {il}"
        );
    }
    assert_eq!(c.embedding_scale, (32f32).sqrt());
    assert_eq!(c.attention_scale, 0.25); // 1/sqrt(head_dim 16)
    assert!(c.qk_norm && c.post_norms && c.rope_type == RopeType::Neox);
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
