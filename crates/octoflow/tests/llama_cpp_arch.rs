//! Every supported architecture checked against llama.cpp itself (llama-cpp-python, installed
//! by scripts/test-deps.sh) on fresh random models: a tiny model of each family with random F32
//! weights and a byte-level SentencePiece vocabulary (so llama.cpp loads it), 256 tokens of real
//! English text (its bytes), and against llama.cpp's CPU backend: the logits of every position
//! from our CPU reference (llama.cpp's roundings: f16 KV cache and attention operands), the
//! mean NLL of the text and the top token wherever llama.cpp's top-2 margin exceeds 0.1 from
//! the CPU reference and from the GPU path (lavapipe in CI), and 16 greedy tokens from several
//! prompts on both paths, which may part from llama.cpp's only at a near-tie. The golden files
//! cover the three real models; this covers what they do not — families without a shipped
//! model and weights nobody tuned. Seed printed, `OCTOFLOW_TEST_SEED` replays.

mod common;

use std::sync::Arc;

use octoflow_gguf::value::{Value, ValueType};
use octoflow_gguf::GgmlType;
use octoflow_model::gpu::GpuModel;
use octoflow_model::testing::{open, quantize_experts, rng, tiny_writer, TinyShape, TINY};
use octoflow_model::{Forward, Logits, Model, Numerics, Session};
use rand::Rng;

/// unk, bos, eos, then the 256 byte tokens.
const N_VOCAB: usize = 259;
/// Tokens of the text whose logits and mean NLL are compared.
const N_TOKENS: usize = 256;
/// Greedy tokens generated from each prompt.
const N_GREEDY: usize = 16;
/// Where a top-2 margin is a near-tie: below it, rounding may pick either token.
const NEAR_TIE: f32 = 0.1;

/// Plain English prose (written for this test), read as bytes: byte `b` is token `3 + b`.
const TEXT: &str = "The old lighthouse stood at the edge of the harbour for more than a \
century. Every evening the keeper climbed the narrow stairs, trimmed the wick and polished \
the great lens until it shone. Ships that passed in the night saw its beam sweep across the \
water and knew that the rocks were near. When the storms of winter came, the keeper stayed \
awake until dawn, writing in his log the names of the boats that returned safely.";

/// One greedy step of llama.cpp: the chosen token and its top-2 margin.
struct Step {
    token: u32,
    margin: f32,
}

struct LlamaCpp {
    logits: Vec<Vec<f32>>,
    greedy: Vec<Vec<Step>>,
}

/// llama.cpp's logits for every position of `ids` and its greedy continuations of `prompts`
/// under the model at `path`.
fn llama_cpp(path: &std::path::Path, ids: &[u32], prompts: &[Vec<u32>]) -> LlamaCpp {
    let req = serde_json::json!({ "ids": ids, "greedy": prompts, "n": N_GREEDY });
    let v = common::llama_cpp_script("llama_logits.py", path, &req);
    let floats = |row: &serde_json::Value| -> Vec<f32> {
        row.as_array()
            .expect("a row")
            .iter()
            .map(|x| x.as_f64().map_or(f32::NAN, |x| x as f32))
            .collect()
    };
    LlamaCpp {
        logits: v["logits"]
            .as_array()
            .expect("logits")
            .iter()
            .map(floats)
            .collect(),
        greedy: v["greedy"]
            .as_array()
            .expect("greedy")
            .iter()
            .map(|steps| {
                steps
                    .as_array()
                    .expect("steps")
                    .iter()
                    .map(|st| Step {
                        token: st["token"].as_u64().expect("token") as u32,
                        margin: st["margin"].as_f64().map_or(f32::NAN, |m| m as f32),
                    })
                    .collect()
            })
            .collect(),
    }
}

/// Mean negative log-likelihood of `ids[1..]` under `logits` (`[ids.len()][N_VOCAB]`, flat).
fn mean_nll(logits: &[f32], ids: &[u32]) -> f64 {
    let rows: Vec<&[f32]> = logits.chunks_exact(N_VOCAB).collect();
    let mut sum = 0f64;
    for (row, &next) in rows.iter().zip(&ids[1..]) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let lse = max
            + row
                .iter()
                .map(|&v| (v as f64 - max).exp())
                .sum::<f64>()
                .ln();
        sum += lse - row[next as usize] as f64;
    }
    sum / (ids.len() - 1) as f64
}

fn top(v: &[f32]) -> usize {
    (0..v.len())
        .max_by(|&a, &b| v[a].total_cmp(&v[b]))
        .unwrap_or(0)
}

/// Greedy tokens from `prompt`, one forward a token.
fn greedy(f: &mut dyn Forward, prompt: &[u32]) -> Vec<u32> {
    let mut last = f.forward(prompt, 0, Logits::Last).expect("prompt");
    let mut out = Vec::new();
    for i in 0..N_GREEDY {
        let t = top(&last) as u32;
        out.push(t);
        if i + 1 < N_GREEDY {
            last = f
                .forward(&[t], prompt.len() + i, Logits::Last)
                .expect("greedy step");
        }
    }
    out
}

/// The mean NLL within 1% of llama.cpp's, its top token wherever llama.cpp's margin exceeds
/// [`NEAR_TIE`], and greedy continuations that part from llama.cpp's only at a near-tie —
/// except at `flips` confident positions and greedy steps: a mixture of experts is
/// discontinuous where two experts' router logits are within rounding of each other, and a
/// path that does not reproduce llama.cpp's roundings (the GPU keeps its KV cache and attention
/// in f32, llama.cpp in f16) may route such a token to the other expert, which moves its output
/// by far more than the rounding.
/// Positions where llama.cpp's top token leads by more than [`NEAR_TIE`] and `logits`' top token
/// is another.
fn confident_flips(logits: &[f32], theirs: &LlamaCpp) -> usize {
    logits
        .chunks_exact(N_VOCAB)
        .zip(&theirs.logits)
        .filter(|(o, t)| {
            let mut sorted = t.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            sorted[0] - sorted[1] > NEAR_TIE && top(o) != top(t)
        })
        .count()
}

fn agrees(
    label: &str,
    path: &str,
    logits: &[f32],
    greedy_tokens: &[Vec<u32>],
    ids: &[u32],
    theirs: &LlamaCpp,
    flips: usize,
) {
    let (ours_nll, their_nll) = (mean_nll(logits, ids), {
        let flat: Vec<f32> = theirs.logits.iter().flatten().copied().collect();
        mean_nll(&flat, ids)
    });
    let rel = (ours_nll - their_nll).abs() / their_nll;
    assert!(
        rel <= 0.01,
        "{label} {path}: mean NLL {ours_nll:.5} against llama.cpp's {their_nll:.5} ({rel:.2e})"
    );
    let mut flipped = Vec::new();
    for (pos, (o, t)) in logits.chunks_exact(N_VOCAB).zip(&theirs.logits).enumerate() {
        let mut sorted = t.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > NEAR_TIE && top(o) != top(t) {
            flipped.push(pos);
        }
    }
    let mut parted = 0;
    for (p, (ours, steps)) in greedy_tokens.iter().zip(&theirs.greedy).enumerate() {
        if let Some(i) = (0..N_GREEDY).find(|&i| ours[i] != steps[i].token) {
            if steps[i].margin > NEAR_TIE && flipped.len() < flips {
                flipped.push(usize::MAX);
                parted += 1;
                continue;
            }
            assert!(
                steps[i].margin <= NEAR_TIE,
                "{label} {path}: prompt {p}: greedy token {i} is {} where llama.cpp's is {} by a margin of {}",
                ours[i],
                steps[i].token,
                steps[i].margin
            );
            parted += 1;
        }
    }
    assert!(
        flipped.len() <= flips,
        "{label} {path}: the top token differs from llama.cpp's at confident positions {flipped:?} (usize::MAX: a greedy step; {flips} allowed)"
    );
    println!(
        "{label} {path}: mean NLL {ours_nll:.5} (llama.cpp {their_nll:.5}, {rel:.1e}); {}/{} greedy continuations equal (the rest part at near-ties); {} confident top tokens differ (routing)",
        greedy_tokens.len() - parted,
        greedy_tokens.len(),
        flipped.len()
    );
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
    /// phi3's LongRoPE: long and short factors (random in [1, 8] and [1, 1.5], as the 128k
    /// files' are), the attention factor of a 32x extension, and an original context below
    /// the runs' (`long`: the long factors apply) or above it (the short ones).
    LongRope {
        long: bool,
    },
}

fn check_arch(arch: &str, variant: Variant, gpu: Option<&octoflow_vk::Context>) {
    let label = match variant {
        Variant::Plain => arch.to_string(),
        Variant::RopeFreqs => format!("{arch}+rope_freqs"),
        Variant::Mxfp4Experts => format!("{arch}+mxfp4"),
        Variant::LongRope { long: true } => format!("{arch}+longrope(long)"),
        Variant::LongRope { long: false } => format!("{arch}+longrope(short)"),
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
        quantize_experts(&mut w, GgmlType::MXFP4);
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
    if let Variant::LongRope { long } = variant {
        let n = head_dim / 2;
        for (name, hi) in [
            ("rope_factors_long.weight", 8.0f32),
            ("rope_factors_short.weight", 1.5),
        ] {
            let f: Vec<u8> = (0..n)
                .flat_map(|_| rng.gen_range(1.0f32..hi).to_le_bytes())
                .collect();
            w.add_tensor(name, GgmlType::F32, &[n as u64], f)
                .expect("LongRoPE factors");
        }
        // the runs' contexts are a few hundred positions (ours 272, llama.cpp's 256)
        let orig = if long { 128 } else { 4096 };
        w.set(
            format!("{arch}.rope.scaling.original_context_length"),
            Value::U32(orig),
        );
        let attn_factor = (1.0 + 32f32.ln() / 4096f32.ln()).sqrt();
        w.set(
            format!("{arch}.rope.scaling.attn_factor"),
            Value::F32(attn_factor),
        );
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
    let ids: Vec<u32> = TEXT
        .bytes()
        .take(N_TOKENS)
        .map(|b| 3 + u32::from(b))
        .collect();
    assert_eq!(ids.len(), N_TOKENS, "the text holds {N_TOKENS} bytes");
    // prompts: the text's start and three stretches from inside it, of 4 to 40 tokens
    let prompts: Vec<Vec<u32>> = [(0usize, 12usize), (40, 4), (100, 40), (180, 20)]
        .iter()
        .map(|&(at, len)| ids[at..at + len].to_vec())
        .collect();
    let mut session = Session::with_numerics(&model, N_TOKENS + N_GREEDY, Numerics::Ggml);
    let ours = session.forward(&ids, 0, Logits::All).expect("forward");
    let theirs = llama_cpp(&path, &ids, &prompts);
    assert_eq!(
        theirs.logits.len(),
        N_TOKENS,
        "{label}: rows from llama.cpp"
    );
    // Random weights must not make a degenerate model: llama.cpp itself must be sure of its
    // top token (margin above a near-tie) at a good share of the text's positions.
    let sure = theirs
        .logits
        .iter()
        .filter(|t| {
            let mut s = (*t).clone();
            s.sort_by(|a, b| b.total_cmp(a));
            s[0] - s[1] > NEAR_TIE
        })
        .count();
    assert!(
        sure * 4 >= N_TOKENS,
        "{label}: llama.cpp is sure of its top token at only {sure} of {N_TOKENS} positions: the random model is too flat"
    );
    // The oracle reproduces llama.cpp's roundings to ~1e-6 over the first 8 positions; past
    // them llama.cpp's CPU attention rounds in a way it does not emulate (1e-4..6e-4 on every
    // family). With MXFP4 experts, whose products llama.cpp takes over Q8_0-quantized
    // activations, such a difference can move an activation's code by one: up to 7.2e-3 seen
    // over 22 seeds of that variant, so it gets 2e-2 where the others keep 4e-3.
    let bound = if variant == Variant::Mxfp4Experts {
        2e-2
    } else {
        4e-3
    };
    // A mixture of experts is discontinuous where two experts' router logits are within
    // rounding of each other: a position whose routing parts from llama.cpp's is off by far
    // more than any rounding (see `agrees`). Such positions are counted, up to 2% of them.
    let moe = matches!(arch, "qwen3moe" | "gpt-oss");
    let routed_apart = if moe { N_TOKENS / 50 } else { 0 };
    let mut worst = 0f32;
    let mut apart = Vec::new();
    for (pos, (o, t)) in ours.chunks_exact(N_VOCAB).zip(&theirs.logits).enumerate() {
        assert_eq!(t.len(), N_VOCAB, "{label}: llama.cpp's vocabulary");
        let scale = t.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
        let mut row_worst = 0f32;
        for (i, (a, b)) in o.iter().zip(t).enumerate() {
            let err = (a - b).abs() / scale;
            // NaN never passes
            assert!(
                !err.is_nan(),
                "{label}: position {pos}, logit {i}: ours {a}, llama.cpp {b}"
            );
            row_worst = row_worst.max(err);
        }
        if row_worst > bound {
            apart.push((pos, row_worst));
        } else {
            worst = worst.max(row_worst);
        }
    }
    assert!(
        apart.len() <= routed_apart,
        "{label}: positions past the bound {bound:e} (position, relative error): {apart:?} ({routed_apart} allowed)"
    );
    println!(
        "{label}: worst relative error {worst:.2e} over {N_TOKENS} positions; {} position(s) routed apart {apart:?}",
        apart.len()
    );
    let cpu_greedy: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut s = Session::with_numerics(&model, N_TOKENS + N_GREEDY, Numerics::Ggml);
            greedy(&mut s, p)
        })
        .collect();
    agrees(
        &label,
        "CPU reference",
        &ours,
        &cpu_greedy,
        &ids,
        &theirs,
        0,
    );
    // The GPU path, the one `run`, `perplexity`, `bench` and `serve` take by default.
    if let Some(ctx) = gpu.as_ref() {
        let gm = GpuModel::load(ctx, &model).expect("gpu model");
        let mut s = gm.session(N_TOKENS + N_GREEDY, 1).expect("gpu session");
        let logits = s.forward(&ids, 0, Logits::All).expect("gpu forward");
        let gpu_greedy: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                let mut s = gm.session(N_TOKENS + N_GREEDY, 1).expect("gpu session");
                greedy(&mut s, p)
            })
            .collect();
        // up to 2% of the positions where routing may part (see `agrees`) — or, where more,
        // as many as the CPU reference in plain f32 (the GPU's numerics: llama.cpp's MXFP4
        // products read Q8_0 codes of their inputs, which route other tokens apart) parts at,
        // and 1% beside
        let moe = matches!(arch, "qwen3moe" | "gpt-oss");
        let flips = if moe {
            let exact = Session::with_numerics(&model, N_TOKENS, Numerics::Exact)
                .forward(&ids, 0, Logits::All)
                .expect("forward");
            let exact_flips = confident_flips(&exact, &theirs);
            (N_TOKENS / 50).max(exact_flips + N_TOKENS / 100)
        } else {
            0
        };
        agrees(&label, "GPU", &logits, &gpu_greedy, &ids, &theirs, flips);
    }
}

#[test]
fn every_architecture_matches_llama_cpp_on_random_models() {
    let gpu = octoflow_vk::testing::gpu_or_skip("llama_cpp_arch on the GPU");
    for arch in [
        "llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3", "gpt-oss",
    ] {
        check_arch(arch, Variant::Plain, gpu.as_ref());
    }
    check_arch("llama", Variant::RopeFreqs, gpu.as_ref());
    check_arch("phi3", Variant::LongRope { long: true }, gpu.as_ref());
    check_arch("phi3", Variant::LongRope { long: false }, gpu.as_ref());
    check_arch("gpt-oss", Variant::Mxfp4Experts, gpu.as_ref());
}
