//! The GGUF writer: metadata in insertion order, tensor infos, then each tensor's data padded to
//! the alignment — the layout llama.cpp and gguf-py produce, so reading a file and writing it back
//! gives the same bytes.

use std::borrow::Cow;
use std::io::Write;
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::reader::{GgufFile, DEFAULT_ALIGNMENT, MAX_DIMS};
use crate::types::GgmlType;
use crate::value::Value;

/// A tensor queued for writing.
#[derive(Debug, Clone)]
pub struct WriterTensor<'a> {
    pub name: String,
    /// Shape in ggml order (`dims[0]` contiguous).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: Cow<'a, [u8]>,
}

/// Builds a GGUF file. Tensor data is borrowed where possible, so copying a memory-mapped model
/// does not duplicate it in memory.
#[derive(Debug, Clone)]
pub struct GgufWriter<'a> {
    version: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<WriterTensor<'a>>,
}

impl Default for GgufWriter<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> GgufWriter<'a> {
    /// An empty GGUF v3 file.
    pub fn new() -> Self {
        Self {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// A writer holding everything `file` holds, in the same order, with borrowed tensor data.
    pub fn from_file(file: &'a GgufFile) -> Self {
        let tensors = file
            .tensors()
            .iter()
            .map(|t| WriterTensor {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
                data: Cow::Borrowed(file.tensor_data(t)),
            })
            .collect();
        Self {
            version: file.version(),
            metadata: file.metadata().to_vec(),
            tensors,
        }
    }

    /// Sets the GGUF version written (2 or 3; the layouts are the same for little-endian files).
    pub fn set_version(&mut self, version: u32) -> Result<()> {
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        self.version = version;
        Ok(())
    }

    /// Sets a metadata value, replacing an existing key in place or appending a new one.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
    }

    /// Removes a metadata key if present.
    pub fn remove(&mut self, key: &str) {
        self.metadata.retain(|(k, _)| k != key);
    }

    /// Metadata in write order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Tensors in write order.
    pub fn tensors(&self) -> &[WriterTensor<'a>] {
        &self.tensors
    }

    /// Mutable access to the queued tensors (to replace data, e.g. when merging adapters).
    pub fn tensors_mut(&mut self) -> &mut Vec<WriterTensor<'a>> {
        &mut self.tensors
    }

    /// Queues a tensor; checks that the data size matches the type and shape.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<()> {
        let name = name.into();
        let data = data.into();
        let bad = |problem: String| GgufError::BadTensor {
            tensor: name.clone(),
            problem,
        };
        if dims.len() > MAX_DIMS {
            return Err(bad(format!(
                "{} dimensions, at most {MAX_DIMS}",
                dims.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor { name });
        }
        let expected = expected_size(ty, dims).ok_or_else(|| {
            bad(format!(
                "shape {dims:?} is not whole {ty} blocks or overflows"
            ))
        })?;
        if expected != data.len() as u64 {
            return Err(bad(format!(
                "{} bytes of data, {ty} {dims:?} needs {expected}",
                data.len()
            )));
        }
        self.tensors.push(WriterTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(())
    }

    fn alignment(&self) -> Result<u64> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, Value::U32(a))) if a.is_power_of_two() => Ok(u64::from(*a)),
            Some((_, v)) => Err(GgufError::BadAlignment {
                found: format!("{} {v}", v.type_description()),
            }),
        }
    }

    /// Writes the whole file to `w`.
    pub fn write_to(&self, w: &mut impl Write) -> Result<()> {
        let align = self.alignment()?;
        let mut head = Vec::new();
        head.extend_from_slice(b"GGUF");
        head.extend_from_slice(&self.version.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut head, key);
            head.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            put_value(&mut head, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut head, &t.name);
            head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset += padded(t.data.len() as u64, align);
        }
        // Pad to the data section only when data follows: a tensor-less file (vocab-only files
        // are) needs none, and an alignment of up to 2^31 must not turn it into gigabytes.
        if !self.tensors.is_empty() {
            head.resize(padded(head.len() as u64, align) as usize, 0);
        }
        w.write_all(&head)?;
        let zeros = vec![0u8; align as usize];
        for t in &self.tensors {
            w.write_all(&t.data)?;
            let pad = padded(t.data.len() as u64, align) - t.data.len() as u64;
            w.write_all(&zeros[..pad as usize])?;
        }
        Ok(())
    }

    /// Writes the file atomically: into a temporary file beside `path`, synced, then renamed, so a
    /// crash never leaves a half-written file under the final name.
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut tmp_name = path.as_os_str().to_owned();
        tmp_name.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp_name);
        let result = (|| {
            let file = std::fs::File::create(&tmp).map_err(io)?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            self.write_to(&mut out)?;
            let file = out.into_inner().map_err(|e| io(e.into_error()))?;
            file.sync_all().map_err(io)?;
            std::fs::rename(&tmp, path).map_err(io)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// Bytes a tensor of this type and shape needs, if the shape is whole blocks.
pub fn expected_size(ty: GgmlType, dims: &[u64]) -> Option<u64> {
    let row_len = dims.first().copied().unwrap_or(1);
    let rows = dims
        .iter()
        .skip(1)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
    ty.row_bytes(row_len)?.checked_mul(rows)
}

fn padded(n: u64, align: u64) -> u64 {
    n.div_ceil(align) * align
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(elem, items) => {
            out.extend_from_slice(&(*elem as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}
