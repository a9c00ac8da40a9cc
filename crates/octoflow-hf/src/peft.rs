//! PEFT LoRA adapter folders (`adapter_config.json`, `adapter_model.safetensors`, as
//! `PeftModel.save_pretrained` writes them) to and from llama.cpp's LoRA GGUF, the one adapter
//! format the rest of OctoFlow reads (`octoflow_model::Adapter`), as llama.cpp's
//! `convert_lora_to_gguf.py` maps them: `base_model.model.model.layers.N.self_attn.q_proj.lora_A
//! .weight` `[rank, n_in]` ↔ `blk.N.attn_q.weight.lora_a` (ggml dims `[n_in, rank]`), `lora_B`
//! `[n_out, rank]` ↔ `.lora_b` (`[rank, n_out]`), `lora_alpha` ↔ `adapter.lora.alpha`. Over a llama
//! base the Q and K projections' output rows are in GGUF's interleaved RoPE order, so `lora_B` of
//! `q_proj` and `k_proj` is permuted on the way in and back on the way out (`names`).

use std::collections::BTreeSet;
use std::path::Path;

use octoflow_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use safetensors::Dtype;
use serde_json::{json, Value as Json};

use crate::error::{HfError, Result};
use crate::json::Obj;
use crate::names::{permute_rows, unpermute_rows};
use crate::shards::Shards;

/// What the adapter's layout depends on in the base model.
#[derive(Debug, Clone, Copy)]
pub struct Base<'a> {
    /// `general.architecture`; `llama` has its Q/K rows permuted.
    pub arch: &'a str,
    pub n_head: usize,
    pub n_head_kv: usize,
}

/// Hugging Face module ↔ GGUF tensor stem, for the projections an adapter may target.
const MODULES: [(&str, &str); 7] = [
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

const PREFIX: &str = "base_model.model.model.layers.";

/// Whether `dir` is a PEFT adapter folder (it has `adapter_config.json`).
pub fn is_adapter(dir: &Path) -> bool {
    dir.join("adapter_config.json").is_file()
}

impl Base<'_> {
    /// The heads whose rows a `lora_B` of `stem` has permuted, if any.
    fn permuted_heads(&self, stem: &str) -> Option<usize> {
        match (self.arch, stem) {
            ("llama", "attn_q") => Some(self.n_head),
            ("llama", "attn_k") => Some(self.n_head_kv),
            _ => None,
        }
    }
}

/// Reads the PEFT folder `dir` as a llama.cpp LoRA GGUF for a model like `base`.
pub fn read(dir: &Path, base: &Base) -> Result<GgufFile> {
    let config_path = dir.join("adapter_config.json");
    let json = crate::json::read(&config_path)?;
    let c = Obj {
        path: &config_path,
        value: &json,
    };
    let unsupported = |what: String, supported: &str| HfError::Unsupported {
        path: config_path.clone(),
        what,
        supported: supported.into(),
    };
    match c.str_opt("peft_type")? {
        Some("LORA") => {}
        other => return Err(unsupported(format!("peft_type {other:?}"), "LORA")),
    }
    for key in ["use_dora", "fan_in_fan_out"] {
        if c.bool_opt(key)?.unwrap_or(false) {
            return Err(unsupported(format!("{key} = true"), "plain LoRA"));
        }
    }
    if let Some(bias) = c.str_opt("bias")?.filter(|b| *b != "none") {
        return Err(unsupported(format!("bias {bias:?}"), "bias \"none\""));
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if c.get(key)
            .is_some_and(|v| v.as_object().is_none_or(|m| !m.is_empty()))
        {
            return Err(unsupported(
                format!("a non-empty {key}"),
                "one rank and alpha for every projection",
            ));
        }
    }
    let r = c.u64("r")?;
    if r == 0 {
        return Err(c.error("r", "the rank must be positive"));
    }
    let lora_alpha = c.f64_opt("lora_alpha")?.unwrap_or(8.0);
    // OctoFlow's scale is alpha / rank; rsLoRA's alpha / sqrt(rank) is that with alpha·sqrt(rank).
    let alpha = if c.bool_opt("use_rslora")?.unwrap_or(false) {
        lora_alpha * (r as f64).sqrt()
    } else {
        lora_alpha
    };

    let weights = dir.join("adapter_model.safetensors");
    let shards = Shards::open_file(&weights)?;
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String(base.arch.into()));
    w.set("general.type", Value::String("adapter".into()));
    w.set("adapter.type", Value::String("lora".into()));
    w.set("adapter.lora.alpha", Value::F32(alpha as f32));
    for hf in shards.names() {
        let bad = |problem: String| HfError::Tensor {
            path: weights.clone(),
            tensor: hf.to_string(),
            problem,
        };
        let view = shards
            .get(hf)
            .ok_or_else(|| bad("listed but not readable".into()))?;
        let (gguf, stem, is_b) = gguf_name(hf).ok_or_else(|| {
            bad(format!(
                "not a LoRA tensor OctoFlow applies ({PREFIX}N.{{self_attn.{{q,k,v,o}}_proj,mlp.{{gate,up,down}}_proj}}.lora_{{A,B}}.weight)"
            ))
        })?;
        let (ty, size) = match view.dtype {
            Dtype::F32 => (GgmlType::F32, 4),
            Dtype::F16 => (GgmlType::F16, 2),
            Dtype::BF16 => (GgmlType::BF16, 2),
            other => return Err(bad(format!("dtype {other:?}; F32, F16 or BF16 expected"))),
        };
        let &[rows, cols] = view.shape else {
            return Err(bad(format!("shape {:?}; a matrix expected", view.shape)));
        };
        let rank_dim = if is_b { cols } else { rows };
        if rank_dim as u64 != r {
            return Err(bad(format!(
                "shape {:?}, but {} says rank {r}",
                view.shape,
                config_path.display()
            )));
        }
        let data = match base.permuted_heads(stem).filter(|_| is_b) {
            Some(n_head) if rows % (2 * n_head) != 0 => {
                return Err(bad(format!(
                    "{rows} rows are not {n_head} heads of rotary pairs"
                )))
            }
            Some(n_head) => permute_rows(view.data, n_head, cols * size),
            None => view.data.to_vec(),
        };
        w.add_tensor(gguf, ty, &[cols as u64, rows as u64], data)?;
    }
    let mut bytes = Vec::new();
    w.write_to(&mut bytes)?;
    Ok(GgufFile::from_bytes(bytes)?)
}

/// `blk.N.<stem>.weight.lora_{a,b}`, the stem and whether it is B, for a PEFT tensor name.
fn gguf_name(hf: &str) -> Option<(String, &'static str, bool)> {
    let rest = hf.strip_prefix(PREFIX)?;
    let (layer, rest) = rest.split_once('.')?;
    let il: usize = layer.parse().ok()?;
    (layer == il.to_string()).then_some(())?;
    let (module, ab) = rest.split_once(".lora_")?;
    let is_b = match ab {
        "A.weight" => false,
        "B.weight" => true,
        _ => return None,
    };
    let &(_, stem) = MODULES.iter().find(|(m, _)| *m == module)?;
    let ab = if is_b { "b" } else { "a" };
    Some((format!("blk.{il}.{stem}.weight.lora_{ab}"), stem, is_b))
}

/// Writes `adapter` (a llama.cpp LoRA GGUF, e.g. `octoflow export`'s) as a PEFT folder `dir`
/// for a model like `base`; `base_model` goes into `base_model_name_or_path`.
pub fn write(adapter: &GgufFile, base: &Base, base_model: &str, dir: &Path) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| HfError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let weights = dir.join("adapter_model.safetensors");
    let alpha = adapter
        .get("adapter.lora.alpha")
        .and_then(Value::as_f64)
        .unwrap_or(0.0) as f32;
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut ranks = BTreeSet::new();
    let mut modules = BTreeSet::new();
    for info in adapter.tensors() {
        let bad = |problem: String| HfError::Tensor {
            path: weights.clone(),
            tensor: info.name.clone(),
            problem,
        };
        let (hf, module, stem, is_b) = hf_name(&info.name)
            .ok_or_else(|| bad("not a LoRA tensor of a projection PEFT targets".into()))?;
        let (dtype, size) = match info.ty {
            GgmlType::F32 => (Dtype::F32, 4),
            GgmlType::F16 => (Dtype::F16, 2),
            GgmlType::BF16 => (Dtype::BF16, 2),
            other => return Err(bad(format!("type {other}; F32, F16 or BF16 expected"))),
        };
        let &[cols, rows] = info.dims.as_slice() else {
            return Err(bad(format!("ggml dims {:?}; a matrix expected", info.dims)));
        };
        let (rows, cols) = (rows as usize, cols as usize);
        ranks.insert(if is_b { cols } else { rows });
        modules.insert(module);
        let data = adapter.tensor_data(info);
        let data = match base.permuted_heads(stem).filter(|_| is_b) {
            Some(n_head) => unpermute_rows(data, n_head, cols * size),
            None => data.to_vec(),
        };
        tensors.push((hf, dtype, vec![rows, cols], data));
    }
    let r = match ranks.into_iter().collect::<Vec<_>>().as_slice() {
        [r] => *r,
        [] => {
            return Err(HfError::Missing {
                path: weights,
                why: "the adapter has no tensors".into(),
            })
        }
        many => {
            return Err(HfError::Unsupported {
                path: weights,
                what: format!("projections of different ranks {many:?}"),
                supported: "one rank for every projection".into(),
            })
        }
    };
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.clone(), v))
                .map_err(|e| HfError::SafeTensors {
                    path: weights.clone(),
                    problem: format!("{name}: {e:?}"),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = Some(std::collections::HashMap::from([(
        "format".to_string(),
        "pt".to_string(),
    )]));
    safetensors::tensor::serialize_to_file(views, &metadata, &weights).map_err(|e| {
        HfError::SafeTensors {
            path: weights.clone(),
            problem: format!("writing: {e:?}"),
        }
    })?;
    // Without an alpha llama.cpp scales by 1, which PEFT writes as alpha = rank.
    let lora_alpha = if alpha == 0.0 { r as f32 } else { alpha };
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": r,
        "lora_alpha": lora_alpha,
        "target_modules": modules.into_iter().collect::<Vec<_>>(),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "modules_to_save": Json::Null,
        "rank_pattern": {},
        "alpha_pattern": {},
    });
    let config_path = dir.join("adapter_config.json");
    let text = serde_json::to_string_pretty(&config).map_err(|source| HfError::Json {
        path: config_path.clone(),
        source,
    })?;
    std::fs::write(&config_path, text).map_err(io(&config_path))
}

/// The PEFT name, PEFT's module name (`q_proj`), the GGUF stem and whether it is B, for a
/// llama.cpp LoRA tensor name.
fn hf_name(gguf: &str) -> Option<(String, &'static str, &'static str, bool)> {
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let il: usize = layer.parse().ok()?;
    let (stem, ab) = rest.split_once(".weight.lora_")?;
    let is_b = match ab {
        "a" => false,
        "b" => true,
        _ => return None,
    };
    let &(module, stem) = MODULES.iter().find(|(_, s)| *s == stem)?;
    let short = module.split_once('.').map_or(module, |(_, m)| m);
    let ab = if is_b { "B" } else { "A" };
    Some((
        format!("{PREFIX}{il}.{module}.lora_{ab}.weight"),
        short,
        stem,
        is_b,
    ))
}
