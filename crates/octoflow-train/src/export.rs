//! What a fine-tune produces for other tools: a LoRA adapter GGUF in llama.cpp's format, and a
//! complete model GGUF with the adapters merged in (optionally requantized).
//!
//! llama.cpp's adapter format: `general.type = "adapter"`, `adapter.type = "lora"`,
//! `adapter.lora.alpha`, the base's `general.architecture`, and per adapted projection
//! `blk.N.<stem>.weight.lora_a` (ggml shape `[n_in, rank]`, i.e. row-major `A [rank, n_in]`) and
//! `.lora_b` (`[rank, n_out]`, row-major `B [n_out, rank]`); llama.cpp scales `B A x` by
//! `alpha / rank`, as training did.

use octoflow_gguf::value::Value;
use octoflow_gguf::{GgmlType, GgufFile, GgufWriter};
use octoflow_model::adapter::Adapter;

use crate::error::{Result, TrainError};

/// `adapter` as a llama.cpp LoRA GGUF for a base of architecture `arch`, tensors in F32.
pub fn adapter_gguf(arch: &str, adapter: &Adapter) -> Result<GgufWriter<'static>> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String(arch.into()));
    w.set("general.type", Value::String("adapter".into()));
    w.set("adapter.type", Value::String("lora".into()));
    w.set("adapter.lora.alpha", Value::F32(adapter.alpha));
    let f32_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    for t in &adapter.tensors {
        let stem = format!("blk.{}.{}.weight", t.layer, t.target.gguf_stem());
        let (r, n_in, n_out) = (t.rank as u64, t.n_in as u64, t.n_out as u64);
        for (name, dims, data) in [
            (format!("{stem}.lora_a"), [n_in, r], &t.a),
            (format!("{stem}.lora_b"), [r, n_out], &t.b),
        ] {
            w.add_tensor(name, GgmlType::F32, &dims, f32_bytes(data))
                .map_err(|e| TrainError::Config(format!("adapter GGUF: {e}")))?;
        }
    }
    Ok(w)
}

/// How merged matrices are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeQuant {
    /// Each merged matrix in its base type (requantized).
    Same,
    /// Every merged matrix in this type.
    To(GgmlType),
}

impl std::str::FromStr for MergeQuant {
    type Err = TrainError;
    fn from_str(s: &str) -> Result<Self> {
        let ty = match s.to_ascii_uppercase().as_str() {
            "SAME" => return Ok(MergeQuant::Same),
            "F32" => GgmlType::F32,
            "F16" => GgmlType::F16,
            "Q8_0" => GgmlType::Q8_0,
            "Q4_K" => GgmlType::Q4_K,
            "Q5_K" => GgmlType::Q5_K,
            "Q6_K" => GgmlType::Q6_K,
            _ => {
                return Err(TrainError::Config(format!(
                    "unknown --quant {s} (same, F32, F16, Q8_0, Q4_K, Q5_K or Q6_K)"
                )))
            }
        };
        Ok(MergeQuant::To(ty))
    }
}

/// `base` with `adapters` (each at `mult` times its scale) merged in, each merged matrix
/// stored per `quant`; metadata and tokenizer carried over.
pub fn merged_gguf<'f>(
    base: &'f GgufFile,
    adapters: &[(&Adapter, f32)],
    quant: MergeQuant,
) -> Result<GgufWriter<'f>> {
    match quant {
        MergeQuant::To(ty) => Ok(crate::merge::merge(base, adapters, Some(ty))?),
        MergeQuant::Same => Ok(crate::merge::merge_same_types(base, adapters)?),
    }
}
