//! The committed tiny folders (tests/fixtures/, made by transformers with make_folders.py) read
//! as the GGUF llama.cpp's converter writes, and damaged copies of them refused with errors that
//! name the file and the tensor at fault.

use std::path::{Path, PathBuf};

use octoflow_gguf::GgmlType;
use octoflow_hf::{open_model, HfFolder};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(family)
}

/// A writable copy of a fixture folder.
fn copy(family: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(fixture(family)).expect("fixture folder") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy");
    }
    dir
}

fn error_of(dir: &Path) -> String {
    match HfFolder::open(dir).and_then(|f| f.to_gguf(None)) {
        Ok(_) => panic!("{} opened, but it is damaged", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_fixture_reads_as_its_family() {
    // (family, stored matrix type, BOS id where the tokenizer adds one)
    for (family, ty, has_bos) in [
        ("qwen2", GgmlType::F32, false),
        ("llama", GgmlType::BF16, true),
        ("qwen3", GgmlType::F16, false),
    ] {
        let g = open_model(&fixture(family)).expect(family);
        assert_eq!(g.get_str("general.architecture").expect("arch"), family);
        assert_eq!(
            g.get_u32(&format!("{family}.block_count")).expect("layers"),
            2
        );
        assert_eq!(
            g.get_u32(&format!("{family}.embedding_length"))
                .expect("n_embd"),
            64
        );
        let n_vocab = g.get_array("tokenizer.ggml.tokens").expect("tokens").len() as u64;
        let embd = g.tensor("token_embd.weight").expect("token_embd");
        assert_eq!(
            embd.dims,
            vec![64, n_vocab],
            "{family}: embedding [n_embd, n_vocab]"
        );
        assert_eq!(embd.ty, ty, "{family}: matrices keep their stored type");
        let q = g.tensor("blk.1.attn_q.weight").expect("attn_q");
        assert_eq!(q.dims, vec![64, 64], "{family}: attn_q");
        let norm = g.tensor("blk.0.attn_norm.weight").expect("attn_norm");
        assert_eq!(norm.ty, GgmlType::F32, "{family}: vectors become F32");
        assert_eq!(
            g.tensor("output.weight").is_some(),
            family == "llama",
            "{family}: an output matrix only where the embeddings are not tied"
        );
        assert_eq!(
            g.tensor("blk.0.attn_q.bias").is_some(),
            family == "qwen2",
            "{family}: Q/K/V biases"
        );
        assert_eq!(
            g.tensor("blk.0.attn_q_norm.weight").is_some(),
            family == "qwen3",
            "{family}: per-head Q/K norms"
        );
        assert!(
            g.get_str("tokenizer.chat_template").is_ok(),
            "{family}: the chat template of chat_template.jinja"
        );
        assert_eq!(
            g.get("tokenizer.ggml.bos_token_id").is_some(),
            has_bos,
            "{family}: BOS"
        );
        assert!(
            g.get("tokenizer.ggml.eos_token_id").is_some(),
            "{family}: EOS"
        );
        // llama 3's post-processor adds BOS; qwen's adds nothing, which llama.cpp's converter leaves unsaid
        assert_eq!(
            g.get_bool("tokenizer.ggml.add_bos_token").ok(),
            has_bos.then_some(true),
            "{family}: add_bos_token"
        );
    }
}

#[test]
fn a_sharded_folder_follows_its_index() {
    let dir = fixture("llama");
    let shards = std::fs::read_dir(&dir)
        .expect("folder")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        })
        .count();
    assert!(shards > 1, "the llama fixture is sharded ({shards} files)");
    let g = open_model(&dir).expect("llama");
    // 2 per model (embedding, final norm) + output + 9 per layer
    assert_eq!(g.tensors().len(), 3 + 2 * 9);
}

#[test]
fn a_truncated_shard_is_a_clear_error_naming_file_and_tensor() {
    let dir = copy("qwen2");
    let file = dir.path().join("model.safetensors");
    let len = std::fs::metadata(&file).expect("size").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .expect("open");
    f.set_len(len - 1000).expect("truncate");
    let err = error_of(dir.path());
    assert!(err.contains("model.safetensors"), "{err}");
    assert!(err.contains("tensor \"model."), "names the tensor: {err}");
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn a_missing_shard_is_a_clear_error_naming_it() {
    let dir = copy("llama");
    let gone = "model-00003-of-00005.safetensors";
    std::fs::remove_file(dir.path().join(gone)).expect("remove a shard");
    let err = error_of(dir.path());
    assert!(err.contains(gone) && err.contains("missing"), "{err}");
}

#[test]
fn a_config_disagreeing_with_the_tensors_is_a_clear_error_naming_both() {
    let dir = copy("qwen2");
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path).expect("config");
    let edited = text.replace("\"intermediate_size\": 128", "\"intermediate_size\": 96");
    assert_ne!(
        text, edited,
        "the fixture's config states intermediate_size 128"
    );
    std::fs::write(&path, edited).expect("write config");
    let err = error_of(dir.path());
    assert!(
        err.contains("model.safetensors")
            && err.contains("config.json")
            && err.contains("mlp.")
            && err.contains("128"),
        "{err}"
    );
}

#[test]
fn a_layer_the_config_names_but_the_weights_lack_is_a_clear_error() {
    let dir = copy("qwen3");
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path).expect("config");
    let edited = text.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    assert_ne!(text, edited, "the fixture's config states 2 layers");
    std::fs::write(&path, edited).expect("write config");
    let err = error_of(dir.path());
    assert!(
        err.contains("model.layers.2.") && err.contains("missing"),
        "{err}"
    );
}

/// The llama fixture's shape, as a PEFT adapter's layout depends on it.
const LLAMA: octoflow_hf::peft::Base<'static> = octoflow_hf::peft::Base {
    arch: "llama",
    n_head: 4,
    n_head_kv: 2,
};

#[test]
fn a_peft_adapter_reads_as_a_llama_cpp_lora() {
    let g = octoflow_hf::peft::read(&fixture("llama-lora"), &LLAMA).expect("llama-lora");
    assert_eq!(g.get_str("general.type").expect("type"), "adapter");
    assert_eq!(g.get_str("adapter.type").expect("adapter type"), "lora");
    assert_eq!(g.get_f32("adapter.lora.alpha").expect("alpha"), 8.0);
    // rank 4 on all 7 projections of both layers
    assert_eq!(g.tensors().len(), 2 * 7 * 2);
    let a = g.tensor("blk.1.attn_q.weight.lora_a").expect("lora_a");
    assert_eq!(a.dims, vec![64, 4], "lora_a: ggml [n_in, rank]");
    let b = g.tensor("blk.0.ffn_down.weight.lora_b").expect("lora_b");
    assert_eq!(b.dims, vec![4, 64], "lora_b: ggml [rank, n_out]");
}

#[test]
fn writing_a_peft_adapter_and_reading_it_back_is_the_identity() {
    let g = octoflow_hf::peft::read(&fixture("llama-lora"), &LLAMA).expect("llama-lora");
    let dir = tempfile::tempdir().expect("temp dir");
    octoflow_hf::peft::write(&g, &LLAMA, "llama", dir.path()).expect("write");
    let back = octoflow_hf::peft::read(dir.path(), &LLAMA).expect("read back");
    assert_eq!(back.metadata(), g.metadata());
    assert_eq!(back.tensors().len(), g.tensors().len());
    for t in g.tensors() {
        let u = back.tensor(&t.name).expect(&t.name);
        assert_eq!((&u.dims, u.ty), (&t.dims, t.ty), "{}", t.name);
        assert!(
            back.tensor_data(u) == g.tensor_data(t),
            "{}: data differs",
            t.name
        );
    }
}

#[test]
fn a_peft_rank_disagreeing_with_the_tensors_is_a_clear_error() {
    let dir = copy("llama-lora");
    let path = dir.path().join("adapter_config.json");
    let text = std::fs::read_to_string(&path).expect("config");
    let edited = text.replace("\"r\": 4", "\"r\": 8");
    assert_ne!(text, edited, "the fixture's config states r 4");
    std::fs::write(&path, edited).expect("write config");
    let err = octoflow_hf::peft::read(dir.path(), &LLAMA)
        .expect_err("rank 8 over rank-4 tensors")
        .to_string();
    assert!(
        err.contains("adapter_model.safetensors")
            && err.contains("lora_")
            && err.contains("rank 8"),
        "{err}"
    );
}

#[test]
fn gpt_oss_reads_its_mxfp4_experts_as_llama_cpp_names_them() {
    let g = open_model(&fixture("gpt-oss")).expect("gpt-oss");
    assert_eq!(g.get_str("general.architecture").expect("arch"), "gpt-oss");
    assert_eq!(g.get_u32("gpt-oss.expert_count").expect("experts"), 4);
    assert_eq!(g.get_u32("gpt-oss.expert_used_count").expect("used"), 2);
    assert_eq!(
        g.get_u32("gpt-oss.attention.sliding_window")
            .expect("window"),
        4
    );
    assert_eq!(g.get_str("tokenizer.ggml.pre").expect("pre"), "gpt-4o");
    assert!(!g
        .get_bool("gpt-oss.rope.scaling.yarn_truncate")
        .expect("the folder's truncate: false"));
    for (name, dims) in [
        ("blk.0.ffn_gate_exps.weight", vec![64, 64, 4]),
        ("blk.0.ffn_up_exps.weight", vec![64, 64, 4]),
        ("blk.1.ffn_down_exps.weight", vec![64, 64, 4]),
    ] {
        let t = g.tensor(name).expect(name);
        assert_eq!((t.ty, &t.dims), (GgmlType::MXFP4, &dims), "{name}");
    }
    let router = g.tensor("blk.0.ffn_gate_inp.weight").expect("router");
    assert_eq!(router.ty, GgmlType::F32, "the router stays F32");
    assert_eq!(
        g.tensor("blk.0.ffn_gate_exps.bias").expect("bias").dims,
        vec![64, 4]
    );
    assert_eq!(
        g.tensor("blk.0.attn_sinks.weight").expect("sinks").dims,
        vec![4]
    );
    assert!(g.tensor("blk.0.post_attention_norm.weight").is_some());
}

#[test]
fn an_unreadable_gpt_oss_config_is_a_clear_error() {
    let edit = |f: &dyn Fn(&mut serde_json::Value)| -> String {
        let dir = copy("gpt-oss");
        let path = dir.path().join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("JSON");
        f(&mut v);
        std::fs::write(&path, v.to_string()).expect("write");
        error_of(dir.path())
    };
    let e = edit(&|v| v["quantization_config"]["quant_method"] = "gptq".into());
    assert!(e.contains("quant_method \"gptq\""), "{e}");
    let e = edit(&|v| v["layer_types"][0] = "full_attention".into());
    assert!(e.contains("layer_types[0]"), "{e}");
    let e = edit(&|v| v["rope_parameters"]["beta_fast"] = 16.0.into());
    assert!(e.contains("beta_fast"), "{e}");
    let e = edit(&|v| v["num_local_experts"] = 8.into());
    assert!(e.contains("router.weight") && e.contains("[8, 64]"), "{e}");
}

#[test]
fn gpt_oss_saved_unquantized_reads_its_experts_transposed() {
    let g = open_model(&fixture("gpt-oss-bf16")).expect("gpt-oss-bf16");
    for name in ["blk.0.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight"] {
        let t = g.tensor(name).expect(name);
        assert_eq!(
            (t.ty, &t.dims),
            (GgmlType::BF16, &vec![64, 64, 4]),
            "{name}"
        );
    }
    // the same experts as the MXFP4 folder, value for value
    let mx = open_model(&fixture("gpt-oss")).expect("gpt-oss");
    let values = |g: &octoflow_gguf::GgufFile, name: &str| -> Vec<f32> {
        let t = g.tensor(name).expect(name);
        let mut out = vec![0f32; t.dims.iter().product::<u64>() as usize];
        octoflow_gguf::quant::dequantize(t.ty, g.tensor_data(t), &mut out).expect("dequantize");
        out
    };
    for name in [
        "blk.0.ffn_gate_exps.weight",
        "blk.0.ffn_up_exps.weight",
        "blk.1.ffn_down_exps.weight",
    ] {
        assert_eq!(values(&g, name), values(&mx, name), "{name}");
    }
    // and quantized at load like any matrix
    let q = HfFolder::open(fixture("gpt-oss-bf16"))
        .and_then(|f| f.to_gguf(Some(GgmlType::Q8_0)))
        .expect("quantized");
    assert_eq!(
        q.tensor("blk.0.ffn_up_exps.weight").expect("up").ty,
        GgmlType::Q8_0
    );
    assert_eq!(
        q.tensor("blk.0.ffn_gate_inp.weight").expect("router").ty,
        GgmlType::F32
    );
}
