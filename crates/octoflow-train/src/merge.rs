//! Folding adapters into a base model: `W' = W + scale · B A` for every adapted projection,
//! written as a new GGUF (same metadata and tokenizer; the merged matrices in F32, or
//! requantized to a given type).

use std::borrow::Cow;

use octoflow_gguf::quant;
use octoflow_gguf::{GgmlType, GgufFile, GgufWriter};
use rayon::prelude::*;

use crate::error::{Result, TrainError};
use crate::lora::LoraLayout;

/// `W + mult · scale · B A` of one adapter over the base's dequantized rows (`[n_out, n_in]`).
fn merged_rows(
    w: &mut [f32],
    layout: &LoraLayout,
    e: &crate::lora::LoraEntry,
    p: &[f32],
    mult: f32,
) {
    let r = layout.rank;
    let s = layout.scale * mult;
    let a = &p[e.a..e.a + r * e.n_in];
    let b = &p[e.b..e.b + e.n_out * r];
    w.par_chunks_exact_mut(e.n_in)
        .enumerate()
        .for_each(|(o, row)| {
            let br = &b[o * r..(o + 1) * r];
            for (j, &bj) in br.iter().enumerate() {
                let c = s * bj;
                if c != 0.0 {
                    for (x, &aj) in row.iter_mut().zip(&a[j * e.n_in..(j + 1) * e.n_in]) {
                        *x += c * aj;
                    }
                }
            }
        });
}

/// A copy of `base` with `params`' adapters (laid out by `layout`) merged in at `mult` times
/// their trained scale; merged matrices are stored as `quant` (`None`: F32).
pub fn merge<'f>(
    base: &'f GgufFile,
    layout: &LoraLayout,
    params: &[f32],
    mult: f32,
    quant_to: Option<GgmlType>,
) -> Result<GgufWriter<'f>> {
    merge_with(base, layout, params, mult, |_| {
        quant_to.unwrap_or(GgmlType::F32)
    })
}

/// [`merge`] keeping every merged matrix in its base type (requantized after the merge).
pub fn merge_same_types<'f>(
    base: &'f GgufFile,
    layout: &LoraLayout,
    params: &[f32],
) -> Result<GgufWriter<'f>> {
    merge_with(base, layout, params, 1.0, |ty| ty)
}

fn merge_with<'f>(
    base: &'f GgufFile,
    layout: &LoraLayout,
    params: &[f32],
    mult: f32,
    type_of: impl Fn(GgmlType) -> GgmlType,
) -> Result<GgufWriter<'f>> {
    if params.len() != layout.n_params {
        return Err(TrainError::Config(format!(
            "adapter has {} values, its layout needs {}",
            params.len(),
            layout.n_params
        )));
    }
    let mut w = GgufWriter::from_file(base);
    for e in &layout.entries {
        let name = format!("blk.{}.{}.weight", e.layer, e.target.gguf_stem());
        let t = w
            .tensors_mut()
            .iter_mut()
            .find(|t| t.name == name)
            .ok_or_else(|| TrainError::Config(format!("the base model has no tensor {name}")))?;
        if t.dims != [e.n_in as u64, e.n_out as u64] {
            return Err(TrainError::Config(format!(
                "{name}: shape {:?} does not match the adapter's [{}, {}]",
                t.dims, e.n_in, e.n_out
            )));
        }
        let mut f = vec![0f32; e.n_in * e.n_out];
        quant::dequantize(t.ty, &t.data, &mut f)
            .map_err(|err| TrainError::Config(format!("{name}: {err}")))?;
        merged_rows(&mut f, layout, e, params, mult);
        let ty = type_of(t.ty);
        let data = if ty == GgmlType::F32 {
            f.iter().flat_map(|v| v.to_le_bytes()).collect()
        } else {
            let n = quant::quantized_size(ty, f.len())
                .map_err(|err| TrainError::Config(format!("{name}: {err}")))?;
            let mut out = vec![0u8; n];
            quant::quantize(ty, &f, &mut out)
                .map_err(|err| TrainError::Config(format!("{name}: {err}")))?;
            out
        };
        t.ty = ty;
        t.data = Cow::Owned(data);
    }
    Ok(w)
}

/// [`merge`], parsed back as an in-memory file (what `octoflow run --lora` loads).
pub fn merged_file(
    base: &GgufFile,
    layout: &LoraLayout,
    params: &[f32],
    mult: f32,
) -> Result<GgufFile> {
    let w = merge(base, layout, params, mult, None)?;
    let mut bytes = Vec::new();
    w.write_to(&mut bytes)
        .map_err(|e| TrainError::Config(format!("writing the merged model: {e}")))?;
    GgufFile::from_bytes(bytes).map_err(|e| TrainError::Config(format!("merged model: {e}")))
}
