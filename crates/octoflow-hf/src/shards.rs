//! The weights of a folder: one `model.safetensors`, or the shards that
//! `model.safetensors.index.json`'s `weight_map` names. Every file is memory-mapped and its header
//! validated by the `safetensors` crate (offsets inside the file, sizes matching dtype × shape,
//! no overlaps) before any tensor is looked at; tensors are then views into the maps.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{HfError, Result};

/// A tensor of a shard: a view into its file's map.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    pub dtype: Dtype,
    /// Shape as PyTorch states it (row-major, last dimension contiguous).
    pub shape: &'a [usize],
    pub data: &'a [u8],
    /// The shard file holding it, for error messages.
    pub file: &'a Path,
}

struct Shard {
    path: PathBuf,
    map: Mmap,
    /// Tensor name → (dtype, shape, byte range in `map`), from the validated header.
    tensors: BTreeMap<String, (Dtype, Vec<usize>, std::ops::Range<usize>)>,
}

/// Every tensor of a folder's SafeTensors files.
pub struct Shards {
    shards: Vec<Shard>,
    /// Tensor name → index into `shards`.
    index: BTreeMap<String, usize>,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field(
                "files",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.index.len())
            .finish()
    }
}

impl Shards {
    /// Opens the weights of `dir` (the single file, or every shard of the index).
    pub fn open(dir: &Path) -> Result<Self> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let files = if index_path.exists() {
            shard_files(&index_path)?
        } else if single.exists() {
            vec![("model.safetensors".to_string(), Vec::new())]
        } else {
            return Err(HfError::Missing {
                path: single,
                why: "no model.safetensors and no model.safetensors.index.json".into(),
            });
        };
        let mut shards = Vec::new();
        let mut index = BTreeMap::new();
        for (name, expected) in files {
            let shard = Shard::open(&dir.join(&name))?;
            for tensor in &expected {
                if !shard.tensors.contains_key(tensor) {
                    return Err(HfError::Tensor {
                        path: shard.path.clone(),
                        tensor: tensor.clone(),
                        problem: format!(
                            "{} maps it to this shard, which does not hold it",
                            index_path.display()
                        ),
                    });
                }
            }
            for tensor in shard.tensors.keys() {
                if let Some(&other) = index.get(tensor) {
                    let other: &Shard = &shards[other];
                    return Err(HfError::Tensor {
                        path: shard.path.clone(),
                        tensor: tensor.clone(),
                        problem: format!("also in {}", other.path.display()),
                    });
                }
                index.insert(tensor.clone(), shards.len());
            }
            shards.push(shard);
        }
        Ok(Self { shards, index })
    }

    /// Opens one SafeTensors file on its own (a PEFT adapter's `adapter_model.safetensors`).
    pub fn open_file(path: &Path) -> Result<Self> {
        let shard = Shard::open(path)?;
        let index = shard.tensors.keys().map(|t| (t.clone(), 0)).collect();
        Ok(Self {
            shards: vec![shard],
            index,
        })
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// The tensor called `name`, if any shard holds it.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let shard = &self.shards[*self.index.get(name)?];
        let (dtype, shape, range) = shard.tensors.get(name)?;
        Some(TensorView {
            dtype: *dtype,
            shape,
            data: &shard.map[range.clone()],
            file: &shard.path,
        })
    }

    /// The file a tensor would be reported against when absent: the index, or the single file.
    pub fn describe(&self) -> PathBuf {
        match self.shards.as_slice() {
            [one] => one.path.clone(),
            _ => self
                .shards
                .first()
                .and_then(|s| s.path.parent())
                .map(|d| d.join("model.safetensors.index.json"))
                .unwrap_or_default(),
        }
    }
}

/// The shard files an index names, each with the tensors it should hold, in file-name order.
fn shard_files(index_path: &Path) -> Result<Vec<(String, Vec<String>)>> {
    let json = crate::json::read(index_path)?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| HfError::Key {
            path: index_path.to_path_buf(),
            key: "weight_map".into(),
            problem: "missing or not an object".into(),
        })?;
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| HfError::Key {
            path: index_path.to_path_buf(),
            key: format!("weight_map.{tensor}"),
            problem: "not a file name".into(),
        })?;
        // A shard name is a file beside the index, never a path out of the folder.
        if file.contains('/') || file.contains('\\') || file.starts_with('.') {
            return Err(HfError::Key {
                path: index_path.to_path_buf(),
                key: format!("weight_map.{tensor}"),
                problem: format!("{file:?} is not a file name in this folder"),
            });
        }
        files
            .entry(file.to_string())
            .or_default()
            .push(tensor.clone());
    }
    Ok(files.into_iter().collect())
}

impl Shard {
    fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => HfError::Missing {
                path: path.to_path_buf(),
                why: "a weights file the folder needs".into(),
            },
            _ => HfError::Io {
                path: path.to_path_buf(),
                source,
            },
        })?;
        // SAFETY: the map is read-only; a file changed underneath us while mapped is outside what
        // any mmap-based loader (ours for GGUF, safetensors', llama.cpp's) can guard against.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| HfError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = |problem: String| HfError::SafeTensors {
            path: path.to_path_buf(),
            problem,
        };
        let parsed = SafeTensors::deserialize(&map).map_err(|e| match past_end(&map) {
            Some((tensor, problem)) => HfError::Tensor {
                path: path.to_path_buf(),
                tensor,
                problem,
            },
            None => bad(format!("{e:?}")),
        })?;
        let base = map.len() - data_len(&map).map_err(bad)?;
        let mut tensors = BTreeMap::new();
        for (name, view) in parsed.tensors() {
            let data = view.data();
            // The view borrows the map; keep its range instead so the shard owns everything.
            let start = data.as_ptr() as usize - map.as_ptr() as usize;
            debug_assert!(start >= base);
            tensors.insert(
                name,
                (
                    view.dtype(),
                    view.shape().to_vec(),
                    start..start + data.len(),
                ),
            );
        }
        Ok(Self {
            path: path.to_path_buf(),
            map,
            tensors,
        })
    }
}

/// The length of the data section: the file minus the 8-byte header length and the header.
fn data_len(bytes: &[u8]) -> std::result::Result<usize, String> {
    let n = bytes
        .get(..8)
        .ok_or("shorter than the 8-byte header length")?;
    let n = u64::from_le_bytes(n.try_into().map_err(|_| "header length")?);
    let header_end = 8u64
        .checked_add(n)
        .filter(|&e| e <= bytes.len() as u64)
        .ok_or("header length past the end of the file")?;
    Ok(bytes.len() - header_end as usize)
}

/// For a file the `safetensors` crate refused: the tensor whose data its header places past the
/// end of the file (a truncated download or copy), and how far, so the error names it.
fn past_end(bytes: &[u8]) -> Option<(String, String)> {
    let n = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    let header_end = usize::try_from(8u64.checked_add(n)?).ok()?;
    let header: serde_json::Value = serde_json::from_slice(bytes.get(8..header_end)?).ok()?;
    let have = (bytes.len() - header_end) as u64;
    let (name, end) = header
        .as_object()?
        .iter()
        .filter_map(|(name, t)| {
            let end = t.get("data_offsets")?.get(1)?.as_u64()?;
            Some((name, end))
        })
        .filter(|&(_, end)| end > have)
        .min_by_key(|&(_, end)| end)?;
    Some((
        name.clone(),
        format!(
            "its data ends at byte {end} of the data section, but the file holds only {have} \
             bytes of data after its header: the file is truncated"
        ),
    ))
}
