//! `config.json` → the family and the `{arch}.*` metadata llama.cpp's converter writes, so the
//! model code configures itself from a folder exactly as from a GGUF file.

use std::path::{Path, PathBuf};

use octoflow_gguf::Value;

use crate::error::{HfError, Result};
use crate::json::Obj;

/// A model family this reader maps to GGUF (the `general.architecture` it becomes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM`, `MistralForCausalLM`: rotary in rotate-half layout, so Q and K rows
    /// are permuted into GGUF's interleaved pairs (see `names::permute_rows`).
    Llama,
    /// `Qwen2ForCausalLM`: Q/K/V biases; NEOX rotary, no permutation.
    Qwen2,
    /// `Qwen3ForCausalLM`: per-head Q/K norms, explicit `head_dim`; NEOX rotary.
    Qwen3,
    /// `GptOssForCausalLM`: Q/K/V/O biases, attention sinks, sliding-window layers alternating
    /// with full ones, a routed mixture of experts whose matrices are MXFP4 blocks; NEOX rotary
    /// with YaRN.
    GptOss,
}

/// The `model_type` values understood, for error messages.
const SUPPORTED: &str = "model_type llama, mistral, qwen2, qwen3, gpt_oss";

impl Family {
    /// The GGUF architecture name.
    pub fn arch(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::GptOss => "gpt-oss",
        }
    }
}

/// The hyper-parameters of `config.json` that shape the tensors.
#[derive(Debug, Clone)]
pub struct HfConfig {
    pub path: PathBuf,
    pub family: Family,
    pub n_vocab: u64,
    pub n_embd: u64,
    pub n_layer: u64,
    pub n_ff: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    /// Experts and experts per token (0 for a dense feed-forward).
    pub n_expert: u64,
    pub n_expert_used: u64,
    pub tie_word_embeddings: bool,
    /// `{arch}.*` metadata in llama.cpp's keys, in the order its converter writes them.
    pub metadata: Vec<(String, Value)>,
}

impl HfConfig {
    /// Reads `dir/config.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let value = crate::json::read(&path)?;
        Self::from_json(&path, &value)
    }

    /// Interprets a parsed `config.json` (`path` only names it in errors).
    pub fn from_json(path: &Path, value: &serde_json::Value) -> Result<Self> {
        let c = Obj { path, value };
        let model_type = c.str_opt("model_type")?.unwrap_or("");
        let family = match model_type {
            "llama" | "mistral" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "gpt_oss" => Family::GptOss,
            other => {
                return Err(HfError::Unsupported {
                    path: path.to_path_buf(),
                    what: format!("model_type {other:?}"),
                    supported: SUPPORTED.into(),
                })
            }
        };
        let n_embd = c.u64("hidden_size")?;
        let n_head = c.u64("num_attention_heads")?;
        if n_head == 0 || n_embd == 0 {
            return Err(c.error(
                "num_attention_heads",
                "hidden_size and head count must be positive",
            ));
        }
        let n_head_kv = c.u64_opt("num_key_value_heads")?.unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(c.error(
                "num_key_value_heads",
                format!("{n_head_kv} does not divide num_attention_heads {n_head}"),
            ));
        }
        let head_dim = match c.u64_opt("head_dim")? {
            Some(d) => d,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(c.error(
                    "head_dim",
                    "missing and hidden_size is not a multiple of the head count",
                ))
            }
        };
        if head_dim % 2 != 0 {
            return Err(c.error("head_dim", format!("{head_dim} is odd; rotary needs pairs")));
        }
        let cfg = Self {
            path: path.to_path_buf(),
            family,
            n_vocab: c.u64("vocab_size")?,
            n_embd,
            n_layer: c.u64("num_hidden_layers")?,
            n_ff: c.u64("intermediate_size")?,
            n_head,
            n_head_kv,
            head_dim,
            n_expert: 0,
            n_expert_used: 0,
            tie_word_embeddings: c.bool_opt("tie_word_embeddings")?.unwrap_or(false),
            metadata: Vec::new(),
        };
        let cfg = match family {
            Family::GptOss => {
                let n_expert = c.u64("num_local_experts")?;
                let n_expert_used = c.u64("num_experts_per_tok")?;
                if n_expert == 0 || n_expert_used == 0 || n_expert_used > n_expert {
                    return Err(c.error(
                        "num_experts_per_tok",
                        format!("{n_expert_used} of {n_expert} experts"),
                    ));
                }
                Self {
                    n_expert,
                    n_expert_used,
                    ..cfg
                }
            }
            _ => cfg,
        };
        check_quantization(&c, family)?;
        let metadata = cfg.arch_metadata(&c)?;
        Ok(Self { metadata, ..cfg })
    }

    fn arch_metadata(&self, c: &Obj) -> Result<Vec<(String, Value)>> {
        let arch = self.family.arch();
        let mut m: Vec<(String, Value)> = Vec::new();
        let mut put = |k: &str, v: Value| m.push((format!("{arch}.{k}"), v));
        let u32_of = |key: &str, v: u64| {
            u32::try_from(v).map_err(|_| c.error(key, format!("{v} does not fit in 32 bits")))
        };
        let ctx = c.u64_opt("max_position_embeddings")?.unwrap_or(4096);
        put(
            "context_length",
            Value::U32(u32_of("max_position_embeddings", ctx)?),
        );
        put(
            "embedding_length",
            Value::U32(u32_of("hidden_size", self.n_embd)?),
        );
        put(
            "block_count",
            Value::U32(u32_of("num_hidden_layers", self.n_layer)?),
        );
        put(
            "feed_forward_length",
            Value::U32(u32_of("intermediate_size", self.n_ff)?),
        );
        put(
            "attention.head_count",
            Value::U32(u32_of("num_attention_heads", self.n_head)?),
        );
        put(
            "attention.head_count_kv",
            Value::U32(u32_of("num_key_value_heads", self.n_head_kv)?),
        );
        // transformers 5 moved rope_theta into rope_parameters; read either.
        let rope = c.get("rope_parameters").or_else(|| c.get("rope_scaling"));
        let rope_obj = rope.map(|value| Obj {
            path: c.path,
            value,
        });
        let theta = match c.f64_opt("rope_theta")? {
            Some(t) => t,
            None => match &rope_obj {
                Some(r) => r.f64_opt("rope_theta")?.unwrap_or(10000.0),
                None => 10000.0,
            },
        };
        put("rope.freq_base", Value::F32(theta as f32));
        let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(1e-6);
        put("attention.layer_norm_rms_epsilon", Value::F32(eps as f32));
        let head_dim = u32_of("head_dim", self.head_dim)?;
        put("attention.key_length", Value::U32(head_dim));
        put("attention.value_length", Value::U32(head_dim));
        // llama.cpp's converter writes these two for the llama family only
        if self.family == Family::Llama {
            put("rope.dimension_count", Value::U32(head_dim));
            put(
                "vocab_size",
                Value::U32(u32_of("vocab_size", self.n_vocab)?),
            );
        }
        if let Some(r) = rope_obj {
            let kind = match r.str_opt("rope_type")? {
                Some(k) => Some(k),
                None => r.str_opt("type")?,
            };
            match kind.unwrap_or("default") {
                "default" => {}
                "linear" => {
                    let f = r
                        .f64_opt("factor")?
                        .ok_or_else(|| c.error("rope_scaling.factor", "missing"))?;
                    put("rope.scaling.type", Value::String("linear".into()));
                    put("rope.scaling.factor", Value::F32(f as f32));
                }
                "yarn" => {
                    let f = r
                        .f64_opt("factor")?
                        .ok_or_else(|| c.error("rope_scaling.factor", "missing"))?;
                    put("rope.scaling.type", Value::String("yarn".into()));
                    put("rope.scaling.factor", Value::F32(f as f32));
                    // OctoFlow's key (llama.cpp has none and always rounds): GPT-OSS's
                    // unrounded correction dimensions
                    for (key, want) in [("beta_fast", 32.0), ("beta_slow", 1.0)] {
                        if let Some(v) = r.f64_opt(key)? {
                            if v != want {
                                return Err(HfError::Unsupported {
                                    path: c.path.to_path_buf(),
                                    what: format!("YaRN {key} = {v}"),
                                    supported: format!("{key} = {want} (llama.cpp's)"),
                                });
                            }
                        }
                    }
                    if r.bool_opt("truncate")? == Some(false) {
                        put("rope.scaling.yarn_truncate", Value::Bool(false));
                    }
                    if let Some(n) = r.u64_opt("original_max_position_embeddings")? {
                        put(
                            "rope.scaling.original_context_length",
                            Value::U32(u32_of("original_max_position_embeddings", n)?),
                        );
                    }
                }
                other => {
                    return Err(HfError::Unsupported {
                        path: c.path.to_path_buf(),
                        what: format!("rope scaling type {other:?}"),
                        supported: "default, linear, yarn".into(),
                    })
                }
            }
        }
        if self.family == Family::GptOss {
            let u32_of = |key: &str, v: u64| {
                u32::try_from(v).map_err(|_| c.error(key, format!("{v} does not fit in 32 bits")))
            };
            m.push((
                "gpt-oss.expert_count".into(),
                Value::U32(u32_of("num_local_experts", self.n_expert)?),
            ));
            m.push((
                "gpt-oss.expert_used_count".into(),
                Value::U32(u32_of("num_experts_per_tok", self.n_expert_used)?),
            ));
            m.push((
                "gpt-oss.expert_feed_forward_length".into(),
                Value::U32(u32_of("intermediate_size", self.n_ff)?),
            ));
            let window = c.u64("sliding_window")?;
            m.push((
                "gpt-oss.attention.sliding_window".into(),
                Value::U32(u32_of("sliding_window", window)?),
            ));
            // llama.cpp's gpt-oss: even layers slide, odd layers attend fully
            if let Some(types) = c.get("layer_types").and_then(serde_json::Value::as_array) {
                for (il, t) in types.iter().enumerate() {
                    let want = if il % 2 == 0 {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    };
                    if t.as_str() != Some(want) {
                        return Err(HfError::Unsupported {
                            path: c.path.to_path_buf(),
                            what: format!("layer_types[{il}] = {t}"),
                            supported: "sliding_attention on even layers, full_attention on odd \
                                        ones (GPT-OSS's pattern)"
                                .into(),
                        });
                    }
                }
            }
            for (key, want) in [("swiglu_limit", 7.0), ("swiglu_alpha", 1.702)] {
                if let Some(v) = c.f64_opt(key)? {
                    if (v - want).abs() > 1e-6 {
                        return Err(HfError::Unsupported {
                            path: c.path.to_path_buf(),
                            what: format!("{key} = {v}"),
                            supported: format!("{key} = {want} (llama.cpp's gpt-oss)"),
                        });
                    }
                }
            }
        }
        if c.bool_opt("use_sliding_window")?.unwrap_or(false) {
            return Err(HfError::Unsupported {
                path: c.path.to_path_buf(),
                what: "use_sliding_window = true".into(),
                supported: "full attention in every layer".into(),
            });
        }
        Ok(m)
    }
}

/// A `quantization_config` other than the MXFP4 experts GPT-OSS ships (GPTQ, AWQ, bitsandbytes
/// ...) stores weights this reader cannot decode: a clear error, not garbage.
fn check_quantization(c: &Obj, family: Family) -> Result<()> {
    let Some(q) = c.get("quantization_config") else {
        return Ok(());
    };
    let method = q
        .get("quant_method")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    if method == "mxfp4" && family == Family::GptOss {
        return Ok(());
    }
    Err(HfError::Unsupported {
        path: c.path.to_path_buf(),
        what: format!("quantization_config with quant_method {method:?}"),
        supported: "unquantized F32/F16/BF16 weights, and GPT-OSS's mxfp4 experts".into(),
    })
}
