//! The GGUF reader: parses the header, metadata and tensor infos of a memory-mapped (or in-memory)
//! file, validates every count, length and offset against the file's size before using it, and
//! hands out zero-copy views of tensor data.
//!
//! File layout (little-endian, GGUF v2/v3):
//! `"GGUF" | u32 version | u64 n_tensors | u64 n_kv | kv* | tensor_info* | pad | data`,
//! where a kv is `string key | u32 type | value`, a string is `u64 len | bytes`, an array is
//! `u32 elem_type | u64 count | elems`, and a tensor info is
//! `string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset`. The data section
//! starts at the next multiple of `general.alignment` (default 32) and offsets are relative to it.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::types::GgmlType;
use crate::value::{Value, ValueType};

/// The default alignment of the data section and of each tensor's data.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: usize = 4;
/// Arrays nested deeper than this are rejected (keeps recursion bounded on hostile input).
pub const MAX_NESTING: usize = 8;

/// One tensor's description from the header.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// GGUF tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Total number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Number of rows (all dimensions but the first).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Elements per row (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }
}

/// Where the bytes of the file live.
enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// The parsed header of a GGUF file (everything but the tensor data).
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

/// An open GGUF file: its header plus zero-copy access to tensor data.
pub struct GgufFile {
    backing: Backing,
    header: Header,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.header.version)
            .field("n_kv", &self.header.metadata.len())
            .field("n_tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a file truncated underneath us by another process is the
        // one case memmap cannot guard against, as with every mmap-based model loader.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_backing(Backing::Mmap(map))
    }

    /// Parses a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<Self> {
        let header = parse_header(backing.bytes())?;
        let key_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Self {
            backing,
            header,
            key_index,
            tensor_index,
        })
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.header.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.backing.bytes()
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.header.metadata[i].1)
    }

    /// A required metadata value.
    pub fn require(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// A required string value.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| wrong_type(key, "string", v))
    }

    /// A required integer value of any integer type that fits in `u64`.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_int()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| wrong_type(key, "non-negative integer", v))
    }

    /// A required integer value that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        v.as_int()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| wrong_type(key, "integer in u32 range", v))
    }

    /// A required numeric value as f32.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| wrong_type(key, "number", v))
    }

    /// A required bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| wrong_type(key, "bool", v))
    }

    /// A required array value.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| wrong_type(key, "array", v))
    }

    /// A tensor's info by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// A required tensor's info.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }

    /// The raw bytes of a tensor (validated to lie inside the file when the header was parsed).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + info.offset) as usize;
        &self.bytes()[start..start + info.size as usize]
    }
}

fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: found.type_description(),
    }
}

/// A bounds-checked little-endian cursor over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what is left.
    fn check_count(&self, count: u64, min_size: u64, what: &dyn Fn() -> String) -> Result<()> {
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|need| need <= self.remaining());
        if fits {
            Ok(())
        } else {
            Err(GgufError::ImplausibleCount {
                what: what(),
                count,
                offset: self.pos as u64,
                remaining: self.remaining(),
            })
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        let start = self.pos as u64;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 {
            what: what(),
            offset: start,
        })
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value> {
        let what = || format!("value of {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            ValueType::U32 => Value::U32(self.u32(&what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            ValueType::U64 => Value::U64(self.u64(&what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            ValueType::Bool => match self.array::<1>(&what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(GgufError::WrongType {
                        key: key.to_string(),
                        expected: "bool (0 or 1)",
                        found: format!("byte {b}"),
                    })
                }
            },
            ValueType::String => Value::String(self.string(&what)?),
            ValueType::Array => {
                if depth >= MAX_NESTING {
                    return Err(GgufError::NestingTooDeep {
                        key: key.to_string(),
                        limit: MAX_NESTING,
                    });
                }
                let type_id = self.u32(&|| format!("array type of {key:?}"))?;
                let elem =
                    ValueType::from_u32(type_id).ok_or_else(|| GgufError::UnknownValueType {
                        key: key.to_string(),
                        type_id,
                    })?;
                let count = self.u64(&|| format!("array length of {key:?}"))?;
                let count_what = || format!("array {key:?}");
                self.check_count(count, elem.min_size(), &count_what)?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }
}

/// Parses and validates everything but the tensor data. Never panics, never allocates more than
/// the input's size justifies.
pub fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array(&|| "magic".into())?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(&|| "version".into())?;
    match version {
        2 | 3 => {}
        v if v.swap_bytes() <= 3 && v.swap_bytes() != 0 => return Err(GgufError::BigEndian),
        v => return Err(GgufError::UnsupportedVersion(v)),
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;
    // A kv takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least 8+4+4+8.
    c.check_count(n_kv, 13, &|| "metadata".into())?;
    c.check_count(n_tensors, 24, &|| "tensor".into())?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    let mut seen = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key = c.string(&|| format!("metadata key #{i}"))?;
        let type_id = c.u32(&|| format!("value type of {key:?}"))?;
        let ty = ValueType::from_u32(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.clone(),
            type_id,
        })?;
        let value = c.value(ty, &key, 0)?;
        if seen.insert(key.clone(), ()).is_some() {
            return Err(GgufError::DuplicateKey { key });
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => {
            return Err(GgufError::BadAlignment {
                found: format!("{} {v}", v.type_description()),
            })
        }
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let info = read_tensor_info(&mut c, i)?;
        if names.insert(info.name.clone(), ()).is_some() {
            return Err(GgufError::DuplicateTensor { name: info.name });
        }
        tensors.push(info);
    }

    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    for t in &tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.size));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_len => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: data_offset.saturating_add(t.offset),
                    end: data_offset.saturating_add(t.offset).saturating_add(t.size),
                    file_len,
                })
            }
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn read_tensor_info(c: &mut Cursor<'_>, index: u64) -> Result<TensorInfo> {
    let name = c.string(&|| format!("name of tensor #{index}"))?;
    let bad = |problem: String| GgufError::BadTensor {
        tensor: name.clone(),
        problem,
    };
    let n_dims = c.u32(&|| format!("n_dims of tensor {name:?}"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(bad(format!(
            "{n_dims} dimensions, at most {MAX_DIMS} allowed"
        )));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(c.u64(&|| format!("dimension {d} of tensor {name:?}"))?);
    }
    let type_id = c.u32(&|| format!("type of tensor {name:?}"))?;
    let ty = GgmlType::from_u32(type_id).ok_or_else(|| GgufError::UnknownTensorType {
        tensor: name.clone(),
        type_id,
    })?;
    let offset = c.u64(&|| format!("data offset of tensor {name:?}"))?;

    // The product of the non-zero dimensions must fit, not only the (possibly zero) total: callers
    // multiply subsets of the dimensions (`n_rows`), and a zero must not excuse `[0, 2^40, 2^40]`.
    let nonzero_product = dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| bad(format!("shape {dims:?} overflows")))?;
    let n_elements = if dims.contains(&0) {
        0
    } else {
        nonzero_product
    };
    let row_len = dims.first().copied().unwrap_or(1);
    let row_bytes = ty.row_bytes(row_len).ok_or_else(|| {
        bad(format!(
            "row length {row_len} is not a multiple of {}'s block size {}",
            ty,
            ty.block_size()
        ))
    })?;
    let n_rows = n_elements.checked_div(row_len).unwrap_or(0);
    let size = row_bytes
        .checked_mul(n_rows)
        .ok_or_else(|| bad(format!("data size of shape {dims:?} overflows")))?;
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        size,
    })
}
