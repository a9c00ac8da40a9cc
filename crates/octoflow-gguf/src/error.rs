//! Errors of the GGUF reader and writer. Each says where in the file and what was expected.

use std::path::PathBuf;

/// What went wrong while reading or writing a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("I/O error while writing GGUF: {0}")]
    Write(#[from] std::io::Error),
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("GGUF version {0} is not supported (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error("file is truncated: reading {what} at byte {offset} needs {needed} bytes, but the file has {file_len}")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("{what} count {count} at byte {offset} cannot fit in the {remaining} bytes left in the file")]
    ImplausibleCount {
        what: String,
        count: u64,
        offset: u64,
        remaining: u64,
    },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("metadata key {key:?}: unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key {key:?}: arrays nested deeper than {limit} levels")]
    NestingTooDeep { key: String, limit: usize },
    #[error("metadata key {key:?} appears twice")]
    DuplicateKey { key: String },
    #[error("tensor {name:?} appears twice")]
    DuplicateTensor { name: String },
    #[error("general.alignment must be a power of two u32, found {found}")]
    BadAlignment { found: String },
    #[error("tensor {tensor:?}: unknown ggml type id {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },
    #[error("tensor {tensor:?}: {problem}")]
    BadTensor { tensor: String, problem: String },
    #[error("tensor {tensor:?}: data [{start}, {end}) lies outside the file ({file_len} bytes)")]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("metadata key {0:?} is missing")]
    MissingKey(String),
    #[error("metadata key {key:?}: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
