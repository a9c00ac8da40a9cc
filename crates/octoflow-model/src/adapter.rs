//! LoRA adapters as llama.cpp stores them, applied at inference without touching the base.
//!
//! A target projection `y = W x` (`W [n_out, n_in]`) becomes `y = W x + s · B (A x)` with
//! `A [rank, n_in]` (GGUF `blk.N.<stem>.weight.lora_a`, ggml dims `[n_in, rank]`) and
//! `B [n_out, rank]` (`.lora_b`, ggml dims `[rank, n_out]`), and `s = user scale · alpha / rank`
//! (`alpha` from `adapter.lora.alpha`; without one, `s` is the user scale — llama.cpp's rule).
//! The file carries `general.type = adapter`, `adapter.type = lora` and the base's
//! `general.architecture`. Tensors may be stored in any type the quant codecs read; they are
//! dequantized to f32 at load.
//!
//! Merging ([`merge`], [`merged_file`]) folds adapters into a copy of the base GGUF instead:
//! `W' = W + Σ mult · s · B A`, merged matrices in F32 or requantized.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use octoflow_gguf::{quant, GgmlType, GgufFile, GgufWriter, TensorInfo};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};

/// A projection that can carry an adapter.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    /// Every target, in the order adapters are laid out within a layer.
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// Position in [`Target::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The short name used on the command line (`q`, `k`, `v`, `o`, `gate`, `up`, `down`).
    pub fn short(self) -> &'static str {
        match self {
            Target::Q => "q",
            Target::K => "k",
            Target::V => "v",
            Target::O => "o",
            Target::Gate => "gate",
            Target::Up => "up",
            Target::Down => "down",
        }
    }

    /// The GGUF tensor stem (`blk.N.<stem>.weight`).
    pub fn gguf_stem(self) -> &'static str {
        match self {
            Target::Q => "attn_q",
            Target::K => "attn_k",
            Target::V => "attn_v",
            Target::O => "attn_output",
            Target::Gate => "ffn_gate",
            Target::Up => "ffn_up",
            Target::Down => "ffn_down",
        }
    }

    /// Parses a comma-separated list (`q,k,v,o,gate,up,down`; `all` for every target).
    pub fn parse_list(s: &str) -> Result<Vec<Target>> {
        if s.trim() == "all" {
            return Ok(Target::ALL.to_vec());
        }
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let t = Target::ALL
                .into_iter()
                .find(|t| t.short() == part || t.gguf_stem() == part)
                .ok_or_else(|| {
                    ModelError::Lora(format!(
                        "unknown LoRA target '{part}' (expected q, k, v, o, gate, up, down or all)"
                    ))
                })?;
            if !out.contains(&t) {
                out.push(t);
            }
        }
        if out.is_empty() {
            return Err(ModelError::Lora("no LoRA targets given".into()));
        }
        out.sort();
        Ok(out)
    }

    /// `(n_in, n_out)` of this projection in a model.
    pub fn dims(self, c: &ModelConfig) -> (usize, usize) {
        match self {
            Target::Q => (c.n_embd, c.q_dim()),
            Target::K => (c.n_embd, c.k_dim()),
            Target::V => (c.n_embd, c.v_dim()),
            Target::O => (c.n_head * c.head_dim_v, c.n_embd),
            Target::Gate | Target::Up => (c.n_embd, c.n_ff),
            Target::Down => (c.n_ff, c.n_embd),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short())
    }
}

/// One adapted projection.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraTensor {
    pub layer: usize,
    pub target: Target,
    pub rank: usize,
    pub n_in: usize,
    pub n_out: usize,
    /// `[rank, n_in]`, f32.
    pub a: Vec<f32>,
    /// `[n_out, rank]`, f32 (the scale is not folded in).
    pub b: Vec<f32>,
}

/// A LoRA adapter for one base model.
#[derive(Debug, Clone, PartialEq)]
pub struct Adapter {
    /// Shown in logs and used as the served model name by default (the file stem).
    pub name: String,
    /// `adapter.lora.alpha`; 0 when the file has none.
    pub alpha: f32,
    /// Sorted by (layer, target).
    pub tensors: Vec<LoraTensor>,
}

/// Most rank one adapted projection may have (the inference kernel stages a row of the
/// adapters' intermediate products in shared memory).
pub const MAX_RANK: usize = 256;

fn bad(name: &str, what: impl fmt::Display) -> ModelError {
    ModelError::Lora(format!("{name}: {what}"))
}

/// `(layer, target, is_b)` of a tensor named `blk.N.<stem>.weight.lora_{a,b}`.
fn parse_name(name: &str) -> Option<(usize, Target, bool)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer = layer.parse().ok()?;
    let (stem, ab) = rest.split_once(".weight.lora_")?;
    let is_b = match ab {
        "a" => false,
        "b" => true,
        _ => return None,
    };
    let target = Target::ALL.into_iter().find(|t| t.gguf_stem() == stem)?;
    Some((layer, target, is_b))
}

fn dequantized(file: &GgufFile, info: &TensorInfo) -> Result<Vec<f32>> {
    let mut out = vec![0f32; info.n_elements() as usize];
    quant::dequantize(info.ty, file.tensor_data(info), &mut out).map_err(|e| bad(&info.name, e))?;
    if let Some(i) = out.iter().position(|v| !v.is_finite()) {
        return Err(bad(&info.name, format!("value {i} is {}", out[i])));
    }
    Ok(out)
}

impl Adapter {
    /// Reads the adapter GGUF at `path` and checks it against the base model's config.
    pub fn open(path: impl AsRef<Path>, c: &ModelConfig) -> Result<Self> {
        let path = path.as_ref();
        let file = GgufFile::open(path).map_err(|source| ModelError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let name = path
            .file_stem()
            .map_or_else(|| "lora".into(), |s| s.to_string_lossy().into_owned());
        Self::from_gguf(&file, &name, c).map_err(|e| match e {
            ModelError::Lora(m) => ModelError::Lora(format!("{}: {m}", path.display())),
            e => e,
        })
    }

    /// Reads an adapter from a parsed GGUF file (see the module documentation).
    pub fn from_gguf(file: &GgufFile, name: &str, c: &ModelConfig) -> Result<Self> {
        let meta = |key: &str| file.get_str(key).ok();
        if meta("general.type") != Some("adapter") || meta("adapter.type") != Some("lora") {
            return Err(ModelError::Lora(format!(
                "not a LoRA adapter (general.type = {:?}, adapter.type = {:?}; expected \"adapter\" and \"lora\")",
                meta("general.type").unwrap_or("none"),
                meta("adapter.type").unwrap_or("none"),
            )));
        }
        let arch = meta("general.architecture").unwrap_or("none");
        if arch != c.arch.name() {
            return Err(ModelError::Lora(format!(
                "the adapter is for architecture {arch}, the model is {}",
                c.arch.name()
            )));
        }
        let alpha = match file.get("adapter.lora.alpha") {
            None => 0.0,
            Some(_) => file.get_f32("adapter.lora.alpha")?,
        };
        if !alpha.is_finite() || alpha < 0.0 {
            return Err(ModelError::Lora(format!("adapter.lora.alpha = {alpha}")));
        }
        let mut pairs: BTreeMap<(usize, Target), [Option<&TensorInfo>; 2]> = BTreeMap::new();
        for info in file.tensors() {
            let (layer, target, is_b) = parse_name(&info.name).ok_or_else(|| {
                bad(
                    &info.name,
                    "not an adapter tensor OctoFlow applies (blk.N.{attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down}.weight.lora_{a,b})",
                )
            })?;
            if layer >= c.n_layer {
                return Err(bad(
                    &info.name,
                    format!("layer {layer}, the model has {}", c.n_layer),
                ));
            }
            pairs.entry((layer, target)).or_default()[usize::from(is_b)] = Some(info);
        }
        if pairs.is_empty() {
            return Err(ModelError::Lora("the adapter has no tensors".into()));
        }
        let mut tensors = Vec::with_capacity(pairs.len());
        for ((layer, target), ab) in pairs {
            let stem = format!("blk.{layer}.{}.weight", target.gguf_stem());
            let [Some(ia), Some(ib)] = ab else {
                return Err(bad(&stem, "lora_a and lora_b must both be present"));
            };
            let (n_in, n_out) = target.dims(c);
            let rank = ia.dims.get(1).copied().unwrap_or(0) as usize;
            if ia.dims.len() != 2 || ia.dims[0] as usize != n_in {
                return Err(bad(
                    &ia.name,
                    format!("ggml dims {:?}, expected [{n_in}, rank]", ia.dims),
                ));
            }
            if ib.dims != [rank as u64, n_out as u64] {
                return Err(bad(
                    &ib.name,
                    format!("ggml dims {:?}, expected [{rank}, {n_out}]", ib.dims),
                ));
            }
            if rank == 0 || rank > MAX_RANK {
                return Err(bad(
                    &stem,
                    format!("rank {rank} is out of range (1..={MAX_RANK})"),
                ));
            }
            tensors.push(LoraTensor {
                layer,
                target,
                rank,
                n_in,
                n_out,
                a: dequantized(file, ia)?,
                b: dequantized(file, ib)?,
            });
        }
        Ok(Adapter {
            name: name.to_string(),
            alpha,
            tensors,
        })
    }

    /// The factor on `B A x` at user scale 1: `alpha / rank`, or 1 without an alpha.
    pub fn scale(&self, t: &LoraTensor) -> f32 {
        if self.alpha == 0.0 {
            1.0
        } else {
            self.alpha / t.rank as f32
        }
    }

    /// The adapter of `target` in `layer`, if any.
    pub fn get(&self, layer: usize, target: Target) -> Option<&LoraTensor> {
        self.tensors
            .iter()
            .find(|t| t.layer == layer && t.target == target)
    }

    /// Adds `mult · scale · B A` to `w` (`[n_out, n_in]` row-major, the dequantized base
    /// matrix of `t`): the merged weight.
    pub fn merge_into(&self, t: &LoraTensor, mult: f32, w: &mut [f32]) {
        let s = self.scale(t) * mult;
        let r = t.rank;
        for (o, row) in w.chunks_exact_mut(t.n_in).enumerate().take(t.n_out) {
            for (j, &bj) in t.b[o * r..(o + 1) * r].iter().enumerate() {
                let f = s * bj;
                if f != 0.0 {
                    for (x, &aj) in row.iter_mut().zip(&t.a[j * t.n_in..(j + 1) * t.n_in]) {
                        *x += f * aj;
                    }
                }
            }
        }
    }
}

// ---- merging: W' = W + Σ mult · scale · B A, written as a new GGUF (same metadata and
// tokenizer; merged matrices in F32 or requantized)

/// A copy of `base` with each `(adapter, mult)` merged in at `mult` times its own scale; merged
/// matrices are stored as `quant_to` (`None`: F32).
pub fn merge<'f>(
    base: &'f GgufFile,
    adapters: &[(&Adapter, f32)],
    quant_to: Option<GgmlType>,
) -> Result<GgufWriter<'f>> {
    merge_with(base, adapters, |_| quant_to.unwrap_or(GgmlType::F32))
}

/// [`merge`] keeping every merged matrix in its base type (requantized after the merge).
pub fn merge_same_types<'f>(
    base: &'f GgufFile,
    adapters: &[(&Adapter, f32)],
) -> Result<GgufWriter<'f>> {
    merge_with(base, adapters, |ty| ty)
}

fn merge_with<'f>(
    base: &'f GgufFile,
    adapters: &[(&Adapter, f32)],
    type_of: impl Fn(GgmlType) -> GgmlType,
) -> Result<GgufWriter<'f>> {
    let targets: BTreeSet<(usize, Target)> = adapters
        .iter()
        .flat_map(|(a, _)| a.tensors.iter().map(|t| (t.layer, t.target)))
        .collect();
    let mut w = GgufWriter::from_file(base);
    for (layer, target) in targets {
        let name = format!("blk.{layer}.{}.weight", target.gguf_stem());
        let t = w
            .tensors_mut()
            .iter_mut()
            .find(|t| t.name == name)
            .ok_or_else(|| ModelError::Lora(format!("the base model has no tensor {name}")))?;
        let parts: Vec<_> = adapters
            .iter()
            .filter_map(|&(a, mult)| a.get(layer, target).map(|lt| (a, lt, mult)))
            .collect();
        let (n_in, n_out) = (parts[0].1.n_in, parts[0].1.n_out);
        if t.dims != [n_in as u64, n_out as u64] {
            return Err(ModelError::Lora(format!(
                "{name}: shape {:?} does not match the adapter's [{n_in}, {n_out}]",
                t.dims
            )));
        }
        let mut f = vec![0f32; n_in * n_out];
        quant::dequantize(t.ty, &t.data, &mut f)
            .map_err(|err| ModelError::Lora(format!("{name}: {err}")))?;
        for (a, lt, mult) in parts {
            if (lt.n_in, lt.n_out) != (n_in, n_out) {
                return Err(ModelError::Lora(format!(
                    "{name}: adapter {} has shape [{}, {}]",
                    a.name, lt.n_in, lt.n_out
                )));
            }
            a.merge_into(lt, mult, &mut f);
        }
        let ty = type_of(t.ty);
        let data = if ty == GgmlType::F32 {
            f.iter().flat_map(|v| v.to_le_bytes()).collect()
        } else {
            let n = quant::quantized_size(ty, f.len())
                .map_err(|err| ModelError::Lora(format!("{name}: {err}")))?;
            let mut out = vec![0u8; n];
            quant::quantize(ty, &f, &mut out)
                .map_err(|err| ModelError::Lora(format!("{name}: {err}")))?;
            out
        };
        t.ty = ty;
        t.data = Cow::Owned(data);
    }
    Ok(w)
}

/// [`merge`] into F32, parsed back as an in-memory file (what the CPU reference runs when
/// given adapters).
pub fn merged_file(base: &GgufFile, adapters: &[(&Adapter, f32)]) -> Result<GgufFile> {
    let w = merge(base, adapters, None)?;
    let mut bytes = Vec::new();
    w.write_to(&mut bytes)
        .map_err(|e| ModelError::Lora(format!("writing the merged model: {e}")))?;
    GgufFile::from_bytes(bytes).map_err(|e| ModelError::Lora(format!("merged model: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_lists_parse_and_reject_unknown_names() {
        assert_eq!(Target::parse_list("all").unwrap(), Target::ALL.to_vec());
        assert_eq!(
            Target::parse_list("down, q,attn_k,q").unwrap(),
            vec![Target::Q, Target::K, Target::Down]
        );
        let e = Target::parse_list("q,foo").unwrap_err().to_string();
        assert!(e.contains("foo"), "{e}");
        assert!(Target::parse_list("").is_err());
    }

    #[test]
    fn tensor_names_parse() {
        assert_eq!(
            parse_name("blk.12.ffn_down.weight.lora_b"),
            Some((12, Target::Down, true))
        );
        assert_eq!(
            parse_name("blk.0.attn_q.weight.lora_a"),
            Some((0, Target::Q, false))
        );
        assert_eq!(parse_name("token_embd.weight.lora_a"), None);
        assert_eq!(parse_name("blk.0.attn_q.weight.lora_c"), None);
        assert_eq!(parse_name("blk.x.attn_q.weight.lora_a"), None);
    }

    #[test]
    fn merge_into_adds_scaled_b_times_a() {
        // rank 1, n_in 2, n_out 2: B A = [[1*3, 1*4], [2*3, 2*4]]; alpha 2 / rank 1 = 2
        let t = LoraTensor {
            layer: 0,
            target: Target::Q,
            rank: 1,
            n_in: 2,
            n_out: 2,
            a: vec![3.0, 4.0],
            b: vec![1.0, 2.0],
        };
        let ad = Adapter {
            name: "x".into(),
            alpha: 2.0,
            tensors: vec![t.clone()],
        };
        let mut w = vec![1.0, 1.0, 1.0, 1.0];
        ad.merge_into(&t, 0.5, &mut w);
        assert_eq!(w, vec![4.0, 5.0, 7.0, 9.0]);
    }
}
