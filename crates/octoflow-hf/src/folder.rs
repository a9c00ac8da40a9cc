//! A Hugging Face folder presented as a GGUF-equivalent model: llama.cpp's metadata keys and
//! tensor names over the folder's weights, so every command that takes a `.gguf` takes a folder.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use octoflow_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use safetensors::Dtype;

use crate::config::{Family, HfConfig};
use crate::error::{HfError, Result};
use crate::names;
use crate::shards::{Shards, TensorView};

/// An opened folder: config, tokenizer metadata and validated weight shards.
#[derive(Debug)]
pub struct HfFolder {
    dir: PathBuf,
    config: HfConfig,
    tokenizer: Vec<(String, Value)>,
    shards: Shards,
}

/// Whether `path` should be read as a Hugging Face folder (a directory) rather than a file.
pub fn is_folder(path: &Path) -> bool {
    path.is_dir()
}

/// A model path as every command reads it (`-m PATH`): a Hugging Face folder becomes the
/// in-memory GGUF llama.cpp's converter would write, with its matrices as stored; any other path
/// is opened as a `.gguf` file.
pub fn open_model(path: &Path) -> Result<GgufFile> {
    if is_folder(path) {
        return HfFolder::open(path)?.to_gguf(None);
    }
    Ok(GgufFile::open(path)?)
}

impl HfFolder {
    /// Reads `config.json`, the tokenizer files and the SafeTensors headers of `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let config = HfConfig::open(&dir)?;
        let tokenizer = crate::tokenizer::metadata(&dir, config.n_vocab)?;
        let shards = Shards::open(&dir)?;
        Ok(Self {
            dir,
            config,
            tokenizer,
            shards,
        })
    }

    /// The hyper-parameters read from `config.json`.
    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// The folder as a GGUF writer: metadata in llama.cpp's keys, tensors under GGUF names.
    /// Tensors whose bytes pass unchanged are borrowed from the memory maps; 1-D tensors
    /// (norms, biases) become F32 as llama.cpp's converter writes them, and the llama family's
    /// Q/K rows are permuted (`names::permute_rows`).
    pub fn writer(&self) -> Result<GgufWriter<'_>> {
        self.writer_as(None)
    }

    /// [`HfFolder::writer`] with every matrix whose rows are whole blocks of `quant` quantized
    /// to it (the same CPU codecs as `export`); other matrices and vectors keep their type.
    pub fn writer_as(&self, quant: Option<GgmlType>) -> Result<GgufWriter<'_>> {
        let mut w = GgufWriter::new();
        w.set(
            "general.architecture",
            Value::String(self.config.family.arch().into()),
        );
        if let Some(name) = self.dir.file_name().and_then(|n| n.to_str()) {
            w.set("general.name", Value::String(name.into()));
        }
        for (k, v) in self.config.metadata.iter().chain(&self.tokenizer) {
            w.set(k.clone(), v.clone());
        }
        let mut wanted = names::required(&self.config);
        if self.config.tie_word_embeddings && self.shards.get("lm_head.weight").is_some() {
            wanted.push("lm_head.weight".into());
        }
        for hf in &wanted {
            let view = self.shards.get(hf).ok_or_else(|| HfError::Tensor {
                path: self.shards.describe(),
                tensor: hf.clone(),
                problem: format!(
                    "missing; config.json describes a {} model that has it",
                    self.config.family.arch()
                ),
            })?;
            let mapped = names::map(&self.config, hf).ok_or_else(|| self.unexpected(hf, view))?;
            let shape: Vec<u64> = view.shape.iter().map(|&d| d as u64).collect();
            if shape != mapped.shape {
                return Err(HfError::Tensor {
                    path: view.file.to_path_buf(),
                    tensor: hf.clone(),
                    problem: format!(
                        "shape {shape:?}, but {} implies {:?}",
                        self.config.path.display(),
                        mapped.shape
                    ),
                });
            }
            let (ty, data) = convert(hf, view, mapped.permute_heads)?;
            let dims: Vec<u64> = shape.iter().rev().copied().collect();
            // the router stays F32 whatever the other matrices become, as llama.cpp keeps it
            let router = mapped.gguf.ends_with("ffn_gate_inp.weight");
            let (ty, data) = match quant {
                _ if router && ty != GgmlType::F32 => {
                    (GgmlType::F32, Cow::Owned(to_f32_bytes(view.dtype, &data)))
                }
                _ if router => (ty, data),
                Some(q) if dims.len() == 2 && dims[0].is_multiple_of(q.block_size() as u64) => {
                    (q, Cow::Owned(quantize(hf, view.file, ty, &data, q)?))
                }
                _ => (ty, data),
            };
            w.add_tensor(mapped.gguf, ty, &dims, data)?;
        }
        let mut experts = Vec::new();
        if self.config.family == Family::GptOss {
            for il in 0..self.config.n_layer {
                experts.extend(self.add_experts(&mut w, il, quant)?);
            }
        }
        for hf in self.shards.names() {
            if !names::ignored(hf)
                && !wanted.iter().any(|w| w == hf)
                && !experts.iter().any(|w| w == hf)
            {
                let view = self
                    .shards
                    .get(hf)
                    .ok_or_else(|| self.unexpected(hf, None))?;
                return Err(self.unexpected(hf, view));
            }
        }
        Ok(w)
    }

    /// The folder as an in-memory GGUF file (what `-m FOLDER` loads).
    pub fn to_gguf(&self, quant: Option<GgmlType>) -> Result<GgufFile> {
        let mut bytes = Vec::new();
        self.writer_as(quant)?.write_to(&mut bytes)?;
        Ok(GgufFile::from_bytes(bytes)?)
    }

    /// GPT-OSS layer `il`'s experts: `ffn_gate_exps`, `ffn_up_exps` (the even and odd rows of
    /// `gate_up`) and `ffn_down_exps` with their biases (F32). From OpenAI's MXFP4 tensors they
    /// become GGUF MXFP4 blocks; from unquantized ones (`gate_up_proj` [E, hidden, 2ff] and
    /// `down_proj` [E, ff, hidden], as transformers saves a dequantized or fine-tuned model)
    /// they are transposed into GGUF's rows in their stored type, or `quant`. Returns the HF
    /// names read.
    fn add_experts(
        &self,
        w: &mut GgufWriter<'_>,
        il: u64,
        quant: Option<GgmlType>,
    ) -> Result<Vec<String>> {
        let names = names::expert_tensors(il);
        let plain = |t: &str| format!("model.layers.{il}.mlp.experts.{t}");
        let c = &self.config;
        let (e, ff, n_exp) = (c.n_embd as usize, c.n_ff as usize, c.n_expert as usize);
        let get = |hf: &str, dtypes: &[Dtype], shape: &[usize]| -> Result<TensorView<'_>> {
            let Some(view) = self.shards.get(hf) else {
                return Err(HfError::Tensor {
                    path: self.shards.describe(),
                    tensor: hf.to_string(),
                    problem: "missing; a GPT-OSS layer's experts need it".into(),
                });
            };
            if !dtypes.contains(&view.dtype) || view.shape != shape {
                return Err(HfError::Tensor {
                    path: view.file.to_path_buf(),
                    tensor: hf.to_string(),
                    problem: format!(
                        "{:?} {:?}, but config.json implies {dtypes:?} {shape:?}",
                        view.dtype, view.shape
                    ),
                });
            }
            Ok(view)
        };
        let floats = [Dtype::F32, Dtype::F16, Dtype::BF16];
        let (n_exp64, e64, ff64) = (n_exp as u64, e as u64, ff as u64);
        let b = |t: &str| format!("blk.{il}.{t}");
        let mxfp4 = self.shards.get(&names[0]).is_some()
            || self.shards.get(&plain("gate_up_proj")).is_none();
        let used = if mxfp4 {
            if e % 32 != 0 || ff % 32 != 0 {
                return Err(HfError::Tensor {
                    path: c.path.clone(),
                    tensor: names[0].clone(),
                    problem: format!("hidden {e} and intermediate {ff} must be multiples of 32"),
                });
            }
            let gu_blocks = get(&names[0], &[Dtype::U8], &[n_exp, 2 * ff, e / 32, 16])?;
            let gu_scales = get(&names[1], &[Dtype::U8], &[n_exp, 2 * ff, e / 32])?;
            let d_blocks = get(&names[3], &[Dtype::U8], &[n_exp, e, ff / 32, 16])?;
            let d_scales = get(&names[4], &[Dtype::U8], &[n_exp, e, ff / 32])?;
            for (t, first) in [("ffn_gate_exps", 0), ("ffn_up_exps", 1)] {
                let blocks = mxfp4_rows(gu_blocks.data, gu_scales.data, 2 * ff, e / 32, first, 2);
                w.add_tensor(
                    b(&format!("{t}.weight")),
                    GgmlType::MXFP4,
                    &[e64, ff64, n_exp64],
                    blocks,
                )?;
            }
            let down = mxfp4_rows(d_blocks.data, d_scales.data, e, ff / 32, 0, 1);
            w.add_tensor(
                b("ffn_down_exps.weight"),
                GgmlType::MXFP4,
                &[ff64, e64, n_exp64],
                down,
            )?;
            names.to_vec()
        } else {
            let gu_name = plain("gate_up_proj");
            let d_name = plain("down_proj");
            let gu = get(&gu_name, &floats, &[n_exp, e, 2 * ff])?;
            let d = get(&d_name, &floats, &[n_exp, ff, e])?;
            let (ty, size) = match gu.dtype {
                Dtype::F32 => (GgmlType::F32, 4),
                Dtype::F16 => (GgmlType::F16, 2),
                _ => (GgmlType::BF16, 2),
            };
            if d.dtype != gu.dtype {
                return Err(HfError::Tensor {
                    path: d.file.to_path_buf(),
                    tensor: d_name,
                    problem: format!("{:?}, but gate_up_proj is {:?}", d.dtype, gu.dtype),
                });
            }
            // element (x, r, k) of a [E, rows_in, cols_in] tensor to row r, column k of expert x
            let transposed = |data: &[u8],
                              rows_in: usize,
                              cols_in: usize,
                              pick: &dyn Fn(usize) -> usize,
                              n_out: usize| {
                let mut out = Vec::with_capacity(n_exp * n_out * rows_in * size);
                for x in 0..n_exp {
                    for r in 0..n_out {
                        let col = pick(r);
                        for k in 0..rows_in {
                            let at = ((x * rows_in + k) * cols_in + col) * size;
                            out.extend_from_slice(&data[at..at + size]);
                        }
                    }
                }
                out
            };
            let store = |hf: &str,
                         file: &Path,
                         data: Vec<u8>,
                         cols: usize|
             -> Result<(GgmlType, Vec<u8>)> {
                match quant {
                    Some(q) if cols.is_multiple_of(q.block_size()) => {
                        Ok((q, quantize(hf, file, ty, &data, q)?))
                    }
                    _ => Ok((ty, data)),
                }
            };
            for (t, first) in [("ffn_gate_exps", 0usize), ("ffn_up_exps", 1)] {
                let rows = transposed(gu.data, e, 2 * ff, &|r| 2 * r + first, ff);
                let (ty, rows) = store(&gu_name, gu.file, rows, e)?;
                w.add_tensor(b(&format!("{t}.weight")), ty, &[e64, ff64, n_exp64], rows)?;
            }
            let rows = transposed(d.data, ff, e, &|r| r, e);
            let (ty, rows) = store(&d_name, d.file, rows, ff)?;
            w.add_tensor(b("ffn_down_exps.weight"), ty, &[ff64, e64, n_exp64], rows)?;
            vec![gu_name, d_name, names[2].clone(), names[5].clone()]
        };
        let gu_bias = get(&names[2], &floats, &[n_exp, 2 * ff])?;
        let d_bias = get(&names[5], &floats, &[n_exp, e])?;
        for (t, first) in [("ffn_gate_exps", 0), ("ffn_up_exps", 1)] {
            let half: Vec<u8> = f32_values(gu_bias)
                .iter()
                .skip(first)
                .step_by(2)
                .flat_map(|x| x.to_le_bytes())
                .collect();
            w.add_tensor(
                b(&format!("{t}.bias")),
                GgmlType::F32,
                &[ff64, n_exp64],
                half,
            )?;
        }
        let bias: Vec<u8> = f32_values(d_bias)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        w.add_tensor(
            b("ffn_down_exps.bias"),
            GgmlType::F32,
            &[e64, n_exp64],
            bias,
        )?;
        Ok(used)
    }

    fn unexpected<'a>(&self, hf: &str, view: impl Into<Option<TensorView<'a>>>) -> HfError {
        HfError::Tensor {
            path: view
                .into()
                .map(|v| v.file.to_path_buf())
                .unwrap_or_else(|| self.shards.describe()),
            tensor: hf.to_string(),
            problem: format!(
                "not a tensor of a {} model as config.json describes it",
                self.config.family.arch()
            ),
        }
    }
}

/// The GGML type and bytes one tensor is stored with.
fn convert<'a>(
    hf: &str,
    view: TensorView<'a>,
    permute_heads: Option<u64>,
) -> Result<(GgmlType, Cow<'a, [u8]>)> {
    let unsupported = || HfError::Unsupported {
        path: view.file.to_path_buf(),
        what: format!(
            "tensor {hf:?} of dtype {:?} and {} dimensions",
            view.dtype,
            view.shape.len()
        ),
        supported: "F32, F16 and BF16 vectors and matrices".into(),
    };
    let (ty, size) = match view.dtype {
        Dtype::F32 => (GgmlType::F32, 4),
        Dtype::F16 => (GgmlType::F16, 2),
        Dtype::BF16 => (GgmlType::BF16, 2),
        _ => return Err(unsupported()),
    };
    let (ty, data): (GgmlType, Cow<'a, [u8]>) = match view.shape.len() {
        1 if ty != GgmlType::F32 => (
            GgmlType::F32,
            Cow::Owned(to_f32_bytes(view.dtype, view.data)),
        ),
        1 | 2 => (ty, Cow::Borrowed(view.data)),
        _ => return Err(unsupported()),
    };
    let data = match permute_heads {
        Some(n_head) => {
            let row_bytes = if view.shape.len() == 2 {
                view.shape[1] * size
            } else {
                4
            };
            Cow::Owned(names::permute_rows(&data, n_head as usize, row_bytes))
        }
        None => data,
    };
    Ok((ty, data))
}

/// `data` of type `ty` re-encoded as `to`.
fn quantize(hf: &str, file: &Path, ty: GgmlType, data: &[u8], to: GgmlType) -> Result<Vec<u8>> {
    use octoflow_gguf::quant;
    let bad = |e: quant::QuantError| HfError::Tensor {
        path: file.to_path_buf(),
        tensor: hf.to_string(),
        problem: format!("quantizing to {to}: {e}"),
    };
    let n = data.len() / ty.type_size();
    let mut f32s = vec![0f32; n];
    quant::dequantize(ty, data, &mut f32s).map_err(bad)?;
    let mut out = vec![0u8; quant::quantized_size(to, n).map_err(bad)?];
    quant::quantize(to, &f32s, &mut out).map_err(bad)?;
    Ok(out)
}

/// GGUF MXFP4 blocks of the rows `first, first + step, ...` of OpenAI's MXFP4 tensors: per
/// row `nb` blocks of 16 bytes (element 2i in byte i's low nibble, 2i + 1 in its high one) and
/// `nb` E8M0 scales. A GGUF block is the scale, then 16 bytes holding element i in the low
/// nibble of byte i and element i + 16 in its high one (the E8M0 byte and the FP4 codes carry
/// over unchanged).
fn mxfp4_rows(
    blocks: &[u8],
    scales: &[u8],
    rows: usize,
    nb: usize,
    first: usize,
    step: usize,
) -> Vec<u8> {
    let n_exp = scales.len() / (rows * nb);
    let nibble = |blk: &[u8], p: usize| (blk[p / 2] >> (4 * (p % 2))) & 0xF;
    let mut out = Vec::with_capacity(n_exp * rows.div_ceil(step) * nb * 17);
    for ex in 0..n_exp {
        for r in (first..rows).step_by(step) {
            for k in 0..nb {
                let at = (ex * rows + r) * nb + k;
                let blk = &blocks[16 * at..16 * at + 16];
                out.push(scales[at]);
                out.extend((0..16).map(|i| nibble(blk, i) | (nibble(blk, i + 16) << 4)));
            }
        }
    }
    out
}

/// A float tensor's values as f32.
fn f32_values(view: TensorView<'_>) -> Vec<f32> {
    match view.dtype {
        Dtype::F32 => view
            .data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        dtype => to_f32_bytes(dtype, view.data)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

/// Little-endian F32 bytes of F16 or BF16 data.
fn to_f32_bytes(dtype: Dtype, data: &[u8]) -> Vec<u8> {
    data.chunks_exact(2)
        .flat_map(|b| {
            let bits = u16::from_le_bytes([b[0], b[1]]);
            let x = match dtype {
                Dtype::BF16 => half::bf16::from_bits(bits).to_f32(),
                _ => half::f16::from_bits(bits).to_f32(),
            };
            x.to_le_bytes()
        })
        .collect()
}
