//! Test support: seeded random data and tiny synthetic models built in memory.
//!
//! Random tests draw a fresh seed each run and print it; rerun one with
//! `OCTOFLOW_TEST_SEED=<seed>`.

use std::sync::Arc;

use octoflow_gguf::value::Value;
use octoflow_gguf::{GgmlType, GgufFile, GgufWriter};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Model;

/// A random generator with a fresh (or `OCTOFLOW_TEST_SEED`) seed, printed for reruns.
pub fn rng(test: &str) -> StdRng {
    let seed = std::env::var("OCTOFLOW_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("{test}: OCTOFLOW_TEST_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// `n` values uniform in `[-1, 1)`.
pub fn random_vec(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

/// The shape of a tiny model.
#[derive(Debug, Clone, Copy)]
pub struct TinyShape {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
}

pub const TINY: TinyShape = TinyShape {
    n_layer: 2,
    n_embd: 32,
    n_ff: 64,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 16,
    n_vocab: 50,
};

/// Experts of the tiny `gpt-oss` model.
pub const TINY_EXPERTS: usize = 4;

/// Metadata and random F32 tensors of a tiny model of `arch` (gemma3 with a sliding window of
/// 4 and 6 layers' worth of pattern when `n_layer >= 6`).
pub fn tiny_writer(arch: &str, s: TinyShape, rng: &mut StdRng) -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{arch}.{k}");
    w.set("general.architecture", Value::String(arch.into()));
    w.set(key("block_count"), Value::U32(s.n_layer as u32));
    w.set(key("context_length"), Value::U32(128));
    w.set(key("embedding_length"), Value::U32(s.n_embd as u32));
    w.set(key("feed_forward_length"), Value::U32(s.n_ff as u32));
    w.set(key("attention.head_count"), Value::U32(s.n_head as u32));
    w.set(
        key("attention.head_count_kv"),
        Value::U32(s.n_head_kv as u32),
    );
    w.set(key("attention.key_length"), Value::U32(s.head_dim as u32));
    w.set(key("attention.value_length"), Value::U32(s.head_dim as u32));
    w.set(key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    w.set(key("rope.freq_base"), Value::F32(10_000.0));
    w.set(key("vocab_size"), Value::U32(s.n_vocab as u32));
    if arch == "gemma3" || arch == "gpt-oss" {
        w.set(key("attention.sliding_window"), Value::U32(4));
    }
    if arch == "gpt-oss" || arch == "qwen3moe" {
        // 4 experts, 2 per token
        w.set(key("expert_count"), Value::U32(TINY_EXPERTS as u32));
        w.set(key("expert_used_count"), Value::U32(2));
        w.set(key("expert_feed_forward_length"), Value::U32(s.n_ff as u32));
    }
    if arch == "gpt-oss" {
        // YaRN over an original context of 64 so that its ramp falls inside the tiny head's
        // frequency pairs
        w.set(key("rope.scaling.type"), Value::String("yarn".into()));
        w.set(key("rope.scaling.factor"), Value::F32(4.0));
        w.set(key("rope.scaling.original_context_length"), Value::U32(64));
    }
    let (q, kv) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    let mut add = |name: String, dims: &[u64], around_one: bool| {
        let n = dims.iter().product::<u64>() as usize;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                let r: f32 = rng.gen_range(-0.5..0.5);
                if around_one {
                    1.0 + r * 0.2
                } else {
                    r
                }
            })
            .collect();
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w.add_tensor(name, GgmlType::F32, dims, bytes)
            .expect("valid tiny tensor");
    };
    let (e, f) = (s.n_embd as u64, s.n_ff as u64);
    add("token_embd.weight".into(), &[e, s.n_vocab as u64], false);
    add("output_norm.weight".into(), &[e], true);
    if arch == "gpt-oss" {
        // llama.cpp's gpt-oss requires its own output matrix (no tied embeddings)
        add("output.weight".into(), &[e, s.n_vocab as u64], false);
    }
    for il in 0..s.n_layer {
        let b = |t: &str| format!("blk.{il}.{t}");
        add(b("attn_norm.weight"), &[e], true);
        if arch == "phi3" {
            // phi3's fused matrices: Q, K, V rows in one; gate rows then up rows in one
            add(b("attn_qkv.weight"), &[e, (q + 2 * kv) as u64], false);
        } else {
            add(b("attn_q.weight"), &[e, q as u64], false);
            add(b("attn_k.weight"), &[e, kv as u64], false);
            add(b("attn_v.weight"), &[e, kv as u64], false);
        }
        add(b("attn_output.weight"), &[q as u64, e], false);
        if arch == "gpt-oss" {
            let x = TINY_EXPERTS as u64;
            for t in ["attn_q.bias", "attn_output.bias"] {
                add(
                    b(t),
                    &[if t == "attn_q.bias" { q as u64 } else { e }],
                    false,
                );
            }
            add(b("attn_k.bias"), &[kv as u64], false);
            add(b("attn_v.bias"), &[kv as u64], false);
            add(b("attn_sinks.weight"), &[s.n_head as u64], false);
            add(b("post_attention_norm.weight"), &[e], true);
            add(b("ffn_gate_inp.weight"), &[e, x], false);
            add(b("ffn_gate_inp.bias"), &[x], false);
            add(b("ffn_gate_exps.weight"), &[e, f, x], false);
            add(b("ffn_up_exps.weight"), &[e, f, x], false);
            add(b("ffn_down_exps.weight"), &[f, e, x], false);
            add(b("ffn_gate_exps.bias"), &[f, x], false);
            add(b("ffn_up_exps.bias"), &[f, x], false);
            add(b("ffn_down_exps.bias"), &[e, x], false);
            continue;
        }
        add(b("ffn_norm.weight"), &[e], true);
        if arch == "qwen3moe" {
            let x = TINY_EXPERTS as u64;
            add(b("attn_q_norm.weight"), &[s.head_dim as u64], true);
            add(b("attn_k_norm.weight"), &[s.head_dim as u64], true);
            add(b("ffn_gate_inp.weight"), &[e, x], false);
            add(b("ffn_gate_exps.weight"), &[e, f, x], false);
            add(b("ffn_up_exps.weight"), &[e, f, x], false);
            add(b("ffn_down_exps.weight"), &[f, e, x], false);
            continue;
        }
        if arch == "phi3" {
            add(b("ffn_up.weight"), &[e, 2 * f], false);
        } else {
            add(b("ffn_gate.weight"), &[e, f], false);
            add(b("ffn_up.weight"), &[e, f], false);
        }
        add(b("ffn_down.weight"), &[f, e], false);
        if arch == "qwen2" {
            add(b("attn_q.bias"), &[q as u64], false);
            add(b("attn_k.bias"), &[kv as u64], false);
            add(b("attn_v.bias"), &[kv as u64], false);
        }
        if arch == "gemma3" || arch == "qwen3" {
            add(b("attn_q_norm.weight"), &[s.head_dim as u64], true);
            add(b("attn_k_norm.weight"), &[s.head_dim as u64], true);
        }
        if arch == "gemma3" {
            add(b("post_attention_norm.weight"), &[e], true);
            add(b("post_ffw_norm.weight"), &[e], true);
        }
    }
    w
}

/// Re-encodes every stacked expert tensor (`*_exps.weight`) of `w`, written in F32, as `ty`
/// (MXFP4: as gpt-oss ships them).
pub fn quantize_experts(w: &mut GgufWriter, ty: GgmlType) {
    for t in w.tensors_mut().iter_mut() {
        if !t.name.ends_with("_exps.weight") || t.ty != GgmlType::F32 {
            continue;
        }
        let values: Vec<f32> = t
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let n_rows = values.len() / t.dims[0] as usize;
        let row = octoflow_gguf::quant::quantized_size(ty, t.dims[0] as usize)
            .expect("rows of whole blocks");
        let mut out = vec![0u8; row * n_rows];
        octoflow_gguf::quant::quantize(ty, &values, &mut out).expect("a type the writer encodes");
        t.ty = ty;
        t.data = out.into();
    }
}

/// Parses the file `w` describes.
pub fn open(w: &GgufWriter) -> Result<GgufFile, octoflow_gguf::GgufError> {
    let mut bytes = Vec::new();
    w.write_to(&mut bytes)?;
    GgufFile::from_bytes(bytes)
}

/// A tiny random model of `arch`.
pub fn tiny_model(arch: &str, s: TinyShape, rng: &mut StdRng) -> Model {
    let file = open(&tiny_writer(arch, s, rng)).expect("tiny model parses");
    Model::from_gguf(Arc::new(file)).expect("tiny model binds")
}

/// Adds a tiny SentencePiece (`llama`) tokenizer to `w`: `<unk> <s> </s> <|im_start|>
/// <|im_end|>`, the 256 byte tokens and a few words, BOS added, no space prefix; with
/// `chat_template`, also `tokenizer.chat_template`. Returns the vocabulary size.
pub fn add_tiny_tokenizer(w: &mut GgufWriter, chat_template: Option<&str>) -> usize {
    use octoflow_gguf::ValueType;
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
        .into_iter()
        .map(String::from)
        .collect();
    let mut types = vec![2, 3, 3, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for word in [
        "\u{2581}",
        "Arr",
        "!",
        "\u{2581}matey",
        "user",
        "assistant",
        "\u{2581}be",
    ] {
        tokens.push(word.to_string());
        types.push(1);
    }
    let n = tokens.len();
    w.set("tokenizer.ggml.model", Value::String("llama".into()));
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(
            ValueType::String,
            tokens.into_iter().map(Value::String).collect(),
        ),
    );
    w.set(
        "tokenizer.ggml.scores",
        Value::Array(
            ValueType::F32,
            (0..n).map(|i| Value::F32(-(i as f32))).collect(),
        ),
    );
    w.set(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
    );
    w.set("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.set("tokenizer.ggml.eos_token_id", Value::U32(2));
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    w.set("tokenizer.ggml.add_space_prefix", Value::Bool(false));
    if let Some(t) = chat_template {
        w.set("tokenizer.chat_template", Value::String(t.into()));
    }
    n
}

/// A random LoRA adapter named `name` of `rank` on `targets` of every layer in `layers` (all
/// layers when empty): A uniform in `±1/sqrt(n_in)` (PEFT's initialisation), B uniform in
/// `±b_bound` (a trained B; PEFT starts it at 0).
#[allow(clippy::too_many_arguments)]
pub fn random_adapter(
    name: &str,
    c: &crate::ModelConfig,
    rank: usize,
    alpha: f32,
    targets: &[crate::Target],
    layers: &[usize],
    b_bound: f32,
    rng: &mut StdRng,
) -> crate::Adapter {
    let all: Vec<usize> = (0..c.n_layer).collect();
    let layers = if layers.is_empty() { &all[..] } else { layers };
    let mut tensors = Vec::new();
    for &layer in layers {
        for &target in targets {
            let (n_in, n_out) = target.dims(c);
            let a_bound = 1.0 / (n_in as f32).sqrt();
            let mut v = |n: usize, r: f32| (0..n).map(|_| rng.gen_range(-r..r)).collect();
            tensors.push(crate::LoraTensor {
                layer,
                target,
                rank,
                n_in,
                n_out,
                a: v(rank * n_in, a_bound),
                b: v(n_out * rank, b_bound),
            });
        }
    }
    crate::Adapter {
        name: name.into(),
        alpha,
        tensors,
    }
}

/// Largest |got - want| relative to the largest |want| (logits of two paths); NaN fails.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter().zip(want).fold(0f32, |m, (g, w)| {
        let d = (g - w).abs();
        assert!(d.is_finite(), "non-finite logit {g} vs {w}");
        m.max(d / scale)
    })
}
