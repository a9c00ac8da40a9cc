//! Every supported architecture checked against llama.cpp itself (llama-cpp-python, installed
//! by scripts/test-deps.sh) on fresh random models: a tiny model of each family with random F32
//! weights and a byte-level SentencePiece vocabulary (so llama.cpp loads it), random token ids,
//! and the logits of every position from our CPU reference (llama.cpp's roundings: f16 KV cache
//! and attention operands) against llama.cpp's CPU backend. The golden files cover the three
//! real models; this covers what they do not — a family without a shipped model (qwen3) and
//! weights nobody tuned. Seed printed, `OCTOFLOW_TEST_SEED` replays.

use std::process::Command;
use std::sync::Arc;

use octoflow_gguf::quant;
use octoflow_gguf::value::{Value, ValueType};
use octoflow_gguf::GgmlType;
use octoflow_model::testing::{open, rng, tiny_writer, TinyShape, TINY};
use octoflow_model::{Logits, Model, Numerics, Session};
use rand::Rng;

/// unk, bos, eos, then the 256 byte tokens.
const N_VOCAB: usize = 259;
const N_TOKENS: usize = 24;

/// llama.cpp's logits for `ids` under the model at `path` (`[ids.len()][N_VOCAB]`).
fn llama_cpp_logits(path: &std::path::Path, ids: &[u32]) -> Vec<Vec<f32>> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/check/llama_logits.py"
    );
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    let out = Command::new("python3")
        .arg(script)
        .arg(path)
        .arg(list.join(","))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "llama_logits.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("logits JSON")
}

/// What a check adds to the plain tiny model of its family.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Plain,
    /// llama 3.1's per-frequency RoPE divisors (`rope_freqs.weight`, random in [1, 8], as
    /// llama 3.1's scaling makes them).
    RopeFreqs,
    /// Expert matrices in MXFP4, as gpt-oss ships them (llama.cpp then quantizes the
    /// activations to Q8_0 for those products).
    Mxfp4Experts,
}

fn check_arch(arch: &str, variant: Variant) {
    let label = match variant {
        Variant::Plain => arch.to_string(),
        Variant::RopeFreqs => format!("{arch}+rope_freqs"),
        Variant::Mxfp4Experts => format!("{arch}+mxfp4"),
    };
    let arch = arch.to_string();
    let arch = arch.as_str();
    let mut rng = rng(&format!("llama_cpp_arch_{label}"));
    // llama.cpp's qwen2 and phi3 loaders take the query width to be n_embd; the others read
    // the head size from the file, so they keep heads wider than n_embd / n_head
    let head_dim = if arch == "qwen2" || arch == "phi3" {
        TINY.n_embd / TINY.n_head
    } else {
        TINY.head_dim
    };
    let shape = TinyShape {
        n_vocab: N_VOCAB,
        head_dim,
        ..TINY
    };
    let mut w = tiny_writer(arch, shape, &mut rng);
    if variant == Variant::Mxfp4Experts {
        for t in w.tensors_mut().iter_mut() {
            if !t.name.ends_with("_exps.weight") {
                continue;
            }
            let values: Vec<f32> = t
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let n_rows = values.len() / t.dims[0] as usize;
            let row = quant::quantized_size(GgmlType::MXFP4, t.dims[0] as usize).expect("size");
            let mut out = vec![0u8; row * n_rows];
            quant::quantize(GgmlType::MXFP4, &values, &mut out).expect("mxfp4");
            t.ty = GgmlType::MXFP4;
            t.data = out.into();
        }
    }
    if variant == Variant::RopeFreqs {
        let n = head_dim / 2;
        let f: Vec<u8> = (0..n)
            .flat_map(|_| rng.gen_range(1.0f32..8.0).to_le_bytes())
            .collect();
        w.add_tensor(
            "rope_freqs.weight",
            octoflow_gguf::GgmlType::F32,
            &[n as u64],
            f,
        )
        .expect("rope_freqs tensor");
    }
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let strings = tokens.into_iter().map(Value::String).collect();
    w.set("tokenizer.ggml.model", Value::String("llama".into()));
    w.set(
        "tokenizer.ggml.tokens",
        Value::Array(ValueType::String, strings),
    );
    let scores = (0..N_VOCAB).map(|_| Value::F32(0.0)).collect();
    w.set(
        "tokenizer.ggml.scores",
        Value::Array(ValueType::F32, scores),
    );
    // 2 = unknown, 3 = control, 6 = byte (llama.cpp's llama_token_type)
    let types = (0..N_VOCAB)
        .map(|i| {
            Value::I32(match i {
                0 => 2,
                1 | 2 => 3,
                _ => 6,
            })
        })
        .collect();
    w.set(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, types),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(format!("tiny-{arch}.gguf"));
    w.write_file(&path).expect("write the tiny model");

    let model = Model::from_gguf(Arc::new(open(&w).expect("tiny model"))).expect("model");
    let ids: Vec<u32> = (0..N_TOKENS)
        .map(|_| rng.gen_range(3..N_VOCAB as u32))
        .collect();
    let mut session = Session::with_numerics(&model, 64, Numerics::Ggml);
    let ours = session.forward(&ids, 0, Logits::All).expect("forward");
    let theirs = llama_cpp_logits(&path, &ids);
    assert_eq!(theirs.len(), N_TOKENS, "{label}: rows from llama.cpp");
    // The oracle reproduces llama.cpp's roundings to ~1e-6 over the first 8 positions; past
    // them llama.cpp's CPU attention rounds in a way it does not emulate (1e-4..6e-4 on every
    // family). With MXFP4 experts, whose products llama.cpp takes over Q8_0-quantized
    // activations, such a difference can move an activation's code by one: up to 7.2e-3 seen
    // over 22 seeds of that variant, so it gets 2e-2 where the others keep 4e-3. Every
    // variant must also pick llama.cpp's top token wherever llama.cpp's top-2 margin exceeds
    // 0.1, which no bound on the logits can loosen.
    let bound = if variant == Variant::Mxfp4Experts {
        2e-2
    } else {
        4e-3
    };
    let mut worst = 0f32;
    for (pos, (o, t)) in ours.chunks_exact(N_VOCAB).zip(&theirs).enumerate() {
        assert_eq!(t.len(), N_VOCAB, "{label}: llama.cpp's vocabulary");
        let top = |v: &[f32]| {
            (0..v.len())
                .max_by(|&a, &b| v[a].total_cmp(&v[b]))
                .unwrap_or(0)
        };
        let mut sorted = t.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 0.1 {
            assert_eq!(top(o), top(t), "{label}: position {pos}: top token differs");
        }
        let scale = t.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
        for (i, (a, b)) in o.iter().zip(t).enumerate() {
            let err = (a - b).abs() / scale;
            // NaN fails: the comparison below is false for it
            assert!(
                err <= bound,
                "{label}: position {pos}, logit {i}: ours {a}, llama.cpp {b} (relative {err})"
            );
            worst = worst.max(err);
        }
    }
    println!("{label}: worst relative error {worst:.2e} over {N_TOKENS} positions");
}

#[test]
fn every_architecture_matches_llama_cpp_on_random_models() {
    for arch in [
        "llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "gpt-oss",
    ] {
        check_arch(arch, Variant::Plain);
    }
    check_arch("llama", Variant::RopeFreqs);
    check_arch("gpt-oss", Variant::Mxfp4Experts);
}
