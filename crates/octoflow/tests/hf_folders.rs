//! Hugging Face folders end to end, against transformers and llama.cpp. The tiny folders of
//! crates/octoflow-hf/tests/fixtures (qwen2 in F32, llama in BF16 over five shards, qwen3 in
//! F16, gpt-oss with MXFP4 experts and gpt-oss-bf16, the same model saved unquantized; random
//! weights, a real byte-level BPE tokenizer.json) were
//! saved by transformers (gpt-oss's expert blocks by make_gpt_oss.py beside it), which
//! also wrote golden.json: the prompt, its ids and transformers' float32 logits at every
//! position. Each folder is
//!
//! - opened as `-m DIR` opens it (`octoflow_hf::open_model`): our tokenizer gives transformers'
//!   ids, and the CPU reference and the GPU path (lavapipe in CI) give transformers' logits
//!   within [`BOUND`] (relative to the row's largest logit) with the same top token at every
//!   position;
//! - converted by `octoflow convert DIR -o X.gguf` into exactly the GGUF `-m DIR` reads, which
//!   llama.cpp (llama-cpp-python, scripts/test-deps.sh) loads and scores like transformers;
//! - run by `octoflow run -m DIR`, plain and through the chat template;
//! - with the PEFT adapter peft saved for the llama folder (`--lora DIR`), within [`BOUND`] of
//!   transformers with peft on the CPU (merged) and the GPU (on the fly), and written back by
//!   `octoflow export --peft` as the same adapter.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use octoflow_model::gpu::GpuModel;
use octoflow_model::testing::rel_err;
use octoflow_model::{Forward, Logits, Model, Session};

const FAMILIES: [&str; 5] = ["qwen2", "llama", "qwen3", "gpt-oss", "gpt-oss-bf16"];

/// Our logits against transformers', both f32 over the same weights: only the order of the
/// sums differs (measured up to 2.6e-6 on the CPU reference and 2.9e-6 on lavapipe; 9.4e-6
/// with the PEFT adapter merged into the weights).
const BOUND: f32 = 1e-4;

/// llama.cpp against transformers: its CPU backend rounds activations to the weights' type
/// (BF16, F16) in matrix products and keeps an f16 KV cache: measured 3.0e-3 (qwen2, F32),
/// 2.3e-3 (qwen3, F16) and 1.7e-2 (llama, BF16: 8-bit mantissas for every activation). A misread
/// tensor (a missed Q/K permutation, a transposed matrix) moves logits by far more.
const LLAMA_CPP_BOUND: f32 = 3e-2;

/// llama.cpp on GPT-OSS: its CPU backend also quantizes the activations to Q8_0 for every MXFP4
/// expert product (MXFP4's dot-product partner type): measured 0.9e-2 to 5.1e-2 per position on
/// the fixture, top tokens equal wherever transformers' margin exceeds [`NEAR_TIE`]; the same
/// model with BF16 experts (gpt-oss-bf16) is held to the same bound.
const LLAMA_CPP_MXFP4_BOUND: f32 = 7e-2;

/// Below this top-2 margin of transformers' logits, llama.cpp's roundings may pick either token.
const NEAR_TIE: f32 = 0.1;

fn folder(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../octoflow-hf/tests/fixtures")
        .join(family)
}

/// transformers' view of a fixture (golden.json).
struct Golden {
    prompt: String,
    ids: Vec<u32>,
    /// `[ids.len()][n_vocab]`.
    logits: Vec<Vec<f32>>,
}

fn golden(family: &str) -> Golden {
    let path = folder(family).join("golden.json");
    let text = std::fs::read_to_string(&path).expect("golden.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("golden.json is JSON");
    let floats = |row: &serde_json::Value| -> Vec<f32> {
        row.as_array()
            .expect("a row")
            .iter()
            .map(|x| x.as_f64().map_or(f32::NAN, |x| x as f32))
            .collect()
    };
    Golden {
        prompt: v["prompt"].as_str().expect("prompt").to_string(),
        ids: v["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|i| i.as_u64().expect("an id") as u32)
            .collect(),
        logits: v["logits"]
            .as_array()
            .expect("logits")
            .iter()
            .map(floats)
            .collect(),
    }
}

/// The tokenizer `-m DIR` builds: the metadata's, encoding through DIR/tokenizer.json.
fn folder_tokenizer(dir: &Path, gguf: &octoflow_gguf::GgufFile) -> octoflow_text::Tokenizer {
    octoflow_text::Tokenizer::from_gguf(gguf)
        .expect("tokenizer")
        .with_tokenizer_json(&dir.join("tokenizer.json"))
        .expect("tokenizer.json agrees with the metadata")
}

fn top(v: &[f32]) -> usize {
    (0..v.len())
        .max_by(|&a, &b| v[a].total_cmp(&v[b]))
        .unwrap_or(0)
}

fn margin(v: &[f32]) -> f32 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s[0] - s[1]
}

/// The worst per-row relative error of `ours` (flat, `[n_tokens][n_vocab]`) against the golden
/// logits, asserted within `bound`; the top token must be transformers' at every position whose
/// top-2 margin is at least `tie` (0: every position).
fn compare(label: &str, ours: &[f32], g: &Golden, bound: f32, tie: f32) -> f32 {
    let n_vocab = g.logits[0].len();
    assert_eq!(ours.len(), g.ids.len() * n_vocab, "{label}: logits shape");
    let mut worst = 0f32;
    for (pos, (o, t)) in ours.chunks_exact(n_vocab).zip(&g.logits).enumerate() {
        let err = rel_err(o, t);
        assert!(
            err <= bound,
            "{label}: position {pos}: relative error {err:.2e} against transformers (bound {bound:.0e})"
        );
        worst = worst.max(err);
        if margin(t) >= tie {
            assert_eq!(
                top(o),
                top(t),
                "{label}: position {pos}: top token {} where transformers' is {} (margin {})",
                top(o),
                top(t),
                margin(t)
            );
        }
    }
    worst
}

#[test]
fn folders_match_transformers_on_the_cpu_and_the_gpu() {
    let gpu = octoflow_vk::testing::gpu_or_skip("hf_folders on the GPU");
    for family in FAMILIES {
        let g = golden(family);
        let gguf = Arc::new(octoflow_hf::open_model(&folder(family)).expect(family));
        // the metadata's tokenizer (what the converted file gives llama.cpp), and the folder's
        // tokenizer.json through the tokenizers crate (what `-m DIR` encodes with)
        let tok = octoflow_text::Tokenizer::from_gguf(&gguf).expect("tokenizer");
        assert_eq!(
            tok.encode(&g.prompt, true, true),
            g.ids,
            "{family}: our tokenizer against transformers' on {:?}",
            g.prompt
        );
        let json = folder_tokenizer(&folder(family), &gguf);
        assert_eq!(
            json.try_encode(&g.prompt, true, true).expect("encodes"),
            g.ids,
            "{family}: tokenizer.json through tokenizers"
        );
        let model = Model::from_gguf(gguf).expect("model");
        let n_ctx = g.ids.len();
        let cpu = Session::new(&model, n_ctx)
            .forward(&g.ids, 0, Logits::All)
            .expect("cpu forward");
        let worst = compare(&format!("{family} CPU"), &cpu, &g, BOUND, 0.0);
        println!("{family}: CPU reference within {worst:.2e} of transformers");
        if let Some(ctx) = gpu.as_ref() {
            let gm = GpuModel::load(ctx, &model).expect("gpu model");
            let mut s = gm.session(n_ctx, 1).expect("gpu session");
            let logits = s.forward(&g.ids, 0, Logits::All).expect("gpu forward");
            let worst = compare(&format!("{family} GPU"), &logits, &g, BOUND, 0.0);
            println!("{family}: GPU within {worst:.2e} of transformers");
        }
    }
}

fn octoflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_octoflow"))
        .args(args)
        .output()
        .expect("the octoflow binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// llama.cpp's logits at every position of `ids` (scripts/check/llama_logits.py).
fn llama_cpp_logits(path: &Path, ids: &[u32]) -> Vec<f32> {
    let v = common::llama_cpp_script("llama_logits.py", path, &serde_json::json!({ "ids": ids }));
    v["logits"]
        .as_array()
        .expect("logits")
        .iter()
        .flat_map(|row| {
            row.as_array()
                .expect("a row")
                .iter()
                .map(|x| x.as_f64().map_or(f32::NAN, |x| x as f32))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn convert_writes_what_llama_cpp_reads_as_transformers_does() {
    let tmp = tempfile::tempdir().expect("temp dir");
    for family in FAMILIES {
        let dir = folder(family);
        let out = tmp.path().join(format!("{family}.gguf"));
        let o = octoflow(&[
            "convert",
            dir.to_str().expect("path"),
            "-o",
            out.to_str().expect("path"),
        ]);
        assert!(o.status.success(), "convert {family}: {}", stderr(&o));
        let written = std::fs::read(&out).expect("converted file");
        let read = octoflow_hf::open_model(&dir).expect(family);
        assert!(
            written == read.bytes(),
            "{family}: convert wrote a different GGUF from the one -m DIR reads"
        );
        let g = golden(family);
        let theirs = llama_cpp_logits(&out, &g.ids);
        let bound = if family.starts_with("gpt-oss") {
            LLAMA_CPP_MXFP4_BOUND
        } else {
            LLAMA_CPP_BOUND
        };
        let worst = compare(&format!("{family} llama.cpp"), &theirs, &g, bound, NEAR_TIE);
        println!("{family}: llama.cpp on the converted file within {worst:.2e} of transformers");
    }
}

#[test]
fn convert_quantizes_the_matrices_it_is_asked_to() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().join("qwen2-q8_0.gguf");
    let dir = folder("qwen2");
    let o = octoflow(&[
        "convert",
        dir.to_str().expect("path"),
        "-o",
        out.to_str().expect("path"),
        "--quant",
        "q8_0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let g = octoflow_gguf::GgufFile::open(&out).expect("converted file");
    for t in g.tensors() {
        let want = if t.dims.len() == 2 {
            octoflow_gguf::GgmlType::Q8_0
        } else {
            octoflow_gguf::GgmlType::F32
        };
        assert_eq!(t.ty, want, "{}", t.name);
    }
    let never = tmp.path().join("never.gguf");
    let o = octoflow(&[
        "convert",
        dir.to_str().expect("path"),
        "-o",
        never.to_str().expect("path"),
        "--quant",
        "q3",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!never.exists(), "an unknown --quant writes nothing");
    assert!(stderr(&o).contains("unknown --quant"), "{}", stderr(&o));
}

#[test]
fn quant_at_load_runs_the_folder_as_its_converted_file() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().join("qwen2-q8_0.gguf");
    let dir = folder("qwen2");
    let dir = dir.to_str().expect("path");
    let o = octoflow(&[
        "convert",
        dir,
        "-o",
        out.to_str().expect("path"),
        "--quant",
        "q8_0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let greedy = |model: &str, quant: &[&str]| -> Output {
        let mut a = vec![
            "run",
            "-m",
            model,
            "-p",
            "The keeper",
            "-n",
            "8",
            "--temp",
            "0",
        ];
        a.extend_from_slice(quant);
        octoflow(&a)
    };
    let at_load = greedy(dir, &["--quant", "q8_0"]);
    assert!(at_load.status.success(), "{}", stderr(&at_load));
    assert!(
        stderr(&at_load).contains("quantized to Q8_0 at load"),
        "{}",
        stderr(&at_load)
    );
    let g = octoflow_gguf::GgufFile::open(&out).expect("converted file");
    assert!(g
        .tensors()
        .iter()
        .any(|t| t.ty == octoflow_gguf::GgmlType::Q8_0));
    let converted = greedy(out.to_str().expect("path"), &[]);
    assert!(converted.status.success(), "{}", stderr(&converted));
    assert_eq!(
        at_load.stdout, converted.stdout,
        "the folder quantized at load and its converted file generate alike"
    );
    // a .gguf is not requantized, and a bad type names the choices
    let o = greedy(out.to_str().expect("path"), &["--quant", "q4_k"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("is a GGUF file"), "{}", stderr(&o));
    let o = greedy(dir, &["--quant", "q3"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unknown --quant"), "{}", stderr(&o));
}

#[test]
fn run_takes_a_folder_with_its_tokenizer_and_chat_template() {
    for family in FAMILIES {
        let dir = folder(family);
        let dir = dir.to_str().expect("path");
        let plain = octoflow(&[
            "run",
            "-m",
            dir,
            "-p",
            "The keeper",
            "-n",
            "4",
            "--temp",
            "0",
        ]);
        assert!(plain.status.success(), "{family}: {}", stderr(&plain));
        assert!(
            stderr(&plain).contains("generated: 4 tokens"),
            "{family}: {}",
            stderr(&plain)
        );
        let chat = octoflow(&[
            "run",
            "-m",
            dir,
            "-p",
            "The keeper",
            "--chat-prompt",
            "-n",
            "4",
            "--temp",
            "0",
        ]);
        assert!(chat.status.success(), "{family}: {}", stderr(&chat));
        // the template wraps the two words in the role markers
        let prompt_tokens = |o: &Output| -> usize {
            let e = stderr(o);
            e.split("prompt: ")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{family}: no prompt token count in {e}"))
        };
        assert!(
            prompt_tokens(&chat) >= prompt_tokens(&plain) + 6,
            "{family}: the chat template was not applied: {}",
            stderr(&chat)
        );
    }
}

#[test]
fn a_damaged_folder_is_a_clear_error_from_the_binary() {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(folder("qwen2")).expect("fixture") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy");
    }
    std::fs::remove_file(dir.path().join("model.safetensors")).expect("remove the weights");
    let o = octoflow(&["run", "-m", dir.path().to_str().expect("path"), "-p", "x"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("model.safetensors") && e.contains("missing") && !e.contains("panicked"),
        "{e}"
    );
}

/// The llama fixture's PEFT adapter (peft's own save; golden.json: transformers with peft
/// applying it), read as `--lora DIR` reads it.
fn peft_adapter(model: &Model) -> octoflow_model::Adapter {
    adapter_folder(model, "llama-lora")
}

/// An adapter folder of the fixtures, read as `--lora DIR` reads it.
fn adapter_folder(model: &Model, name: &str) -> octoflow_model::Adapter {
    let c = &model.config;
    let base = octoflow_hf::peft::Base {
        arch: c.arch.name(),
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
    };
    let file = octoflow_hf::peft::read(&folder(name), &base).expect(name);
    octoflow_model::Adapter::from_gguf(&file, name, c).expect("adapter")
}

/// Both adapter folders against peft's logits with them: llama-lora, which peft saved, and
/// llama-lora-octoflow, which `octoflow train` + `export --peft` wrote and peft loaded to make
/// its golden.json (fixtures/peft_golden.py) — so peft reads what we write, and we read it as
/// peft does.
#[test]
fn a_peft_adapter_matches_peft_on_the_cpu_and_the_gpu() {
    let gpu = octoflow_vk::testing::gpu_or_skip("hf_folders' PEFT adapter on the GPU");
    for name in ["llama-lora", "llama-lora-octoflow"] {
        peft_agreement(name, gpu.as_ref());
    }
}

fn peft_agreement(name: &str, gpu: Option<&octoflow_vk::Context>) {
    let g = golden(name);
    let gguf = Arc::new(octoflow_hf::open_model(&folder("llama")).expect("llama"));
    let model = Model::from_gguf(gguf.clone()).expect("model");
    let adapter = adapter_folder(&model, name);
    assert_eq!(adapter.tensors.len(), 14, "every projection of both layers");
    let n_ctx = g.ids.len();
    // the CPU reference runs adapters merged into the weights, as `run --device cpu --lora`
    let merged = octoflow_model::adapter::merged_file(&gguf, &[(&adapter, 1.0)]).expect("merge");
    let merged = Model::from_gguf(Arc::new(merged)).expect("merged model");
    let cpu = Session::new(&merged, n_ctx)
        .forward(&g.ids, 0, Logits::All)
        .expect("cpu forward");
    let worst = compare(&format!("{name} CPU"), &cpu, &g, BOUND, 0.0);
    println!("{name}: CPU reference within {worst:.2e} of peft");
    if let Some(ctx) = gpu {
        let mut gm = GpuModel::load(ctx, &model).expect("gpu model");
        gm.set_adapters(&[adapter], &[1.0]).expect("adapters");
        let mut s = gm.session(n_ctx, 1).expect("gpu session");
        let logits = s.forward(&g.ids, 0, Logits::All).expect("gpu forward");
        let worst = compare(&format!("{name} GPU"), &logits, &g, BOUND, 0.0);
        println!("{name}: GPU (adapters on the fly) within {worst:.2e} of peft");
    }
}

#[test]
fn export_writes_a_peft_folder_that_reads_back_as_the_adapter() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = tmp.path().join("peft");
    let (base, lora) = (folder("llama"), folder("llama-lora"));
    let o = octoflow(&[
        "export",
        "-m",
        base.to_str().expect("path"),
        "--lora",
        lora.to_str().expect("path"),
        "--peft",
        "-o",
        out.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let gguf = Arc::new(octoflow_hf::open_model(&base).expect("llama"));
    let model = Model::from_gguf(gguf).expect("model");
    let c = &model.config;
    let b = octoflow_hf::peft::Base {
        arch: c.arch.name(),
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
    };
    let file = octoflow_hf::peft::read(&out, &b).expect("the exported folder");
    let exported = octoflow_model::Adapter::from_gguf(&file, "llama-lora", c).expect("adapter");
    assert_eq!(exported, peft_adapter(&model));
    let run = octoflow(&[
        "run",
        "-m",
        base.to_str().expect("path"),
        "--lora",
        out.to_str().expect("path"),
        "-p",
        "The keeper",
        "-n",
        "2",
        "--temp",
        "0",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("14 projections, alpha 8"),
        "{}",
        stderr(&run)
    );
}

/// `octoflow perplexity --json --device cpu` of `text` under the llama folder with `lora`.
fn cpu_nll(lora: &Path, text: &Path) -> f64 {
    let base = folder("llama");
    let o = octoflow(&[
        "perplexity",
        "-m",
        base.to_str().expect("path"),
        "--lora",
        lora.to_str().expect("path"),
        "-f",
        text.to_str().expect("path"),
        "--json",
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("perplexity JSON");
    v["mean_nll"].as_f64().expect("mean_nll")
}

#[test]
fn a_run_trained_on_a_folder_exports_as_a_peft_adapter_that_scores_alike() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let (run, peft) = (tmp.path().join("run"), tmp.path().join("peft"));
    let base = folder("llama");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/pirate/eval.jsonl");
    let o = octoflow(&[
        "train",
        "-m",
        base.to_str().expect("path"),
        "--data",
        data.to_str().expect("path"),
        "-o",
        run.to_str().expect("path"),
        "--max-steps",
        "2",
        "--seq-len",
        "64",
        "--batch",
        "2",
        "--lr",
        "1e-2",
    ]);
    assert!(o.status.success(), "train: {}", stderr(&o));
    let o = octoflow(&[
        "export",
        "-m",
        base.to_str().expect("path"),
        "--lora",
        run.to_str().expect("path"),
        "--peft",
        "-o",
        peft.to_str().expect("path"),
    ]);
    assert!(o.status.success(), "export --peft: {}", stderr(&o));
    let text = tmp.path().join("text.txt");
    std::fs::write(
        &text,
        "The old lighthouse stood at the edge of the harbour for more than a century.",
    )
    .expect("text");
    // f32 adapters both ways: the same numbers, so the same NLL to rounding
    let (from_run, from_peft) = (cpu_nll(&run, &text), cpu_nll(&peft, &text));
    assert!(
        (from_run - from_peft).abs() <= 1e-5 * from_run.abs(),
        "mean NLL with the run's adapters {from_run}, with their PEFT export {from_peft}"
    );
}

/// llama.cpp's token ids (special tokens parsed, no BOS) of `texts` with the GGUF at `path`
/// (scripts/check/llama_text.py).
fn llama_cpp_ids(path: &Path, texts: &[&str]) -> Vec<Vec<u32>> {
    let req = serde_json::json!({ "texts": texts, "ids": [], "conversations": [] });
    let v = common::llama_cpp_script("llama_text.py", path, &req);
    v["special"]
        .as_array()
        .expect("special")
        .iter()
        .map(|ids| {
            ids.as_array()
                .expect("ids")
                .iter()
                .map(|i| i.as_u64().expect("an id") as u32)
                .collect()
        })
        .collect()
}

/// The llama folder's weights with fixtures/llama-spm's SentencePiece-style tokenizer.json
/// (Llama 2's "▁" normalizer, or Mistral's Metaspace pre-tokenizer) and tokenizer_config.json,
/// made by make_spm_tokenizer.py with `tokenizers`, whose ids golden.json holds.
fn spm_folder(into: &Path, tokenizer: &str) {
    std::fs::create_dir_all(into).expect("dir");
    for entry in std::fs::read_dir(folder("llama")).expect("llama fixture") {
        let p = entry.expect("entry").path();
        let name = p.file_name().and_then(|n| n.to_str()).expect("name");
        if !name.starts_with("tokenizer") && name != "chat_template.jinja" {
            std::fs::copy(&p, into.join(name)).expect("copy");
        }
    }
    let spm = folder("llama-spm");
    std::fs::copy(spm.join(tokenizer), into.join("tokenizer.json")).expect("copy");
    std::fs::copy(
        spm.join("tokenizer_config.json"),
        into.join("tokenizer_config.json"),
    )
    .expect("copy");
}

#[test]
fn a_sentencepiece_tokenizer_json_tokenizes_as_tokenizers_and_llama_cpp_do() {
    let path = folder("llama-spm").join("golden.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("golden")).expect("JSON");
    let cases = |variant: &str| -> Vec<(String, Vec<u32>)> {
        golden[variant]
            .as_array()
            .expect("cases")
            .iter()
            .map(|c| {
                let ids = c["ids"].as_array().expect("ids");
                let ids = ids.iter().map(|i| i.as_u64().expect("id") as u32).collect();
                (c["text"].as_str().expect("text").to_string(), ids)
            })
            .collect()
    };
    let normalizer = cases("normalizer");
    let tmp = tempfile::tempdir().expect("temp dir");
    // The metadata (and llama.cpp on the converted file) gives the Prepend normalizer's ids for
    // both escapings: llama.cpp prefixes "▁" to the input and to text after a special token;
    // Metaspace's "first" does neither on a text that already starts with a space or after a
    // special token. `-m DIR` encodes through tokenizer.json, and so gives each file's own ids.
    let mut differ = 0;
    for (tokenizer, variant) in [
        ("tokenizer.json", "normalizer"),
        ("tokenizer-metaspace.json", "metaspace"),
    ] {
        let dir = tmp.path().join(tokenizer);
        spm_folder(&dir, tokenizer);
        let gguf = octoflow_hf::open_model(&dir).expect("the folder opens");
        assert_eq!(gguf.get_str("tokenizer.ggml.model").ok(), Some("llama"));
        let tok = octoflow_text::Tokenizer::from_gguf(&gguf).expect("tokenizer");
        let json = folder_tokenizer(&dir, &gguf);
        for ((text, want), (_, native)) in normalizer.iter().zip(&cases(variant)) {
            let ids = tok.encode(text, true, true);
            assert_eq!(&ids, want, "{tokenizer}: {text:?}");
            let got = json.try_encode(text, true, true).expect("encodes");
            assert_eq!(&got, native, "{tokenizer} through tokenizers: {text:?}");
            differ += usize::from(native != want);
            // and back, the special tokens dropped
            if !text.contains("<s>") {
                for (how, t) in [("metadata", &tok), ("tokenizer.json", &json)] {
                    let back = t.decode(&t.encode(text, true, true));
                    assert_eq!(
                        back.trim_start(),
                        text.trim_start(),
                        "{tokenizer} {how}: decode"
                    );
                }
            }
        }
        // the CLI encodes a folder through its tokenizer.json
        let o = octoflow(&[
            "tokenize",
            "-m",
            dir.to_str().expect("path"),
            "--json",
            &normalizer[2].0,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
        let ids: Vec<u32> = serde_json::from_value(doc["ids"].clone()).expect("ids");
        assert_eq!(
            ids,
            cases(variant)[2].1,
            "octoflow tokenize -m DIR ({tokenizer})"
        );
        assert!(doc["tokenizer"]["tokenizer_json"].is_string(), "{doc}");
        // llama.cpp on the converted file: the same ids (it adds no BOS here)
        let out = tmp.path().join(format!("{tokenizer}.gguf"));
        let o = octoflow(&[
            "convert",
            dir.to_str().expect("path"),
            "-o",
            out.to_str().expect("path"),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let texts: Vec<&str> = normalizer.iter().map(|(t, _)| t.as_str()).collect();
        for ((text, want), got) in normalizer.iter().zip(llama_cpp_ids(&out, &texts)) {
            assert_eq!(got, want[1..], "llama.cpp, {tokenizer}: {text:?}");
        }
    }
    assert!(
        differ > 0,
        "no case tells the Metaspace file's ids from llama.cpp's"
    );
    // another model's tokenizer.json is refused: its ids would index the wrong embedding rows
    let gguf = octoflow_hf::open_model(&tmp.path().join("tokenizer.json")).expect("opens");
    let other = folder("qwen2").join("tokenizer.json");
    let e = octoflow_text::Tokenizer::from_gguf(&gguf)
        .expect("tokenizer")
        .with_tokenizer_json(&other)
        .expect_err("a foreign tokenizer.json");
    let e = e.to_string();
    assert!(e.contains("qwen2") && e.contains("vocabulary"), "{e}");
}
