//! A Hugging Face folder presented as a GGUF-equivalent model: llama.cpp's metadata keys and
//! tensor names over the folder's weights, so every command that takes a `.gguf` takes a folder.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use octoflow_gguf::{GgmlType, GgufFile, GgufWriter, Value};
use safetensors::Dtype;

use crate::config::HfConfig;
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
            let (ty, data) = match quant {
                Some(q) if dims.len() == 2 && dims[0].is_multiple_of(q.block_size() as u64) => {
                    (q, Cow::Owned(quantize(hf, view.file, ty, &data, q)?))
                }
                _ => (ty, data),
            };
            w.add_tensor(mapped.gguf, ty, &dims, data)?;
        }
        for hf in self.shards.names() {
            if !names::ignored(hf) && !wanted.iter().any(|w| w == hf) {
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
