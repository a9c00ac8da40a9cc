//! Reading the folder's JSON files, with errors that name the file and key.

use std::path::Path;

use serde_json::Value;

use crate::error::{HfError, Result};

/// Parses a JSON file.
pub fn read(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => HfError::Missing {
            path: path.to_path_buf(),
            why: "a file the folder needs".into(),
        },
        _ => HfError::Io {
            path: path.to_path_buf(),
            source,
        },
    })?;
    serde_json::from_str(&text).map_err(|source| HfError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses a JSON file when it exists.
pub fn read_optional(path: &Path) -> Result<Option<Value>> {
    if path.exists() {
        read(path).map(Some)
    } else {
        Ok(None)
    }
}

/// Typed access to one JSON object's keys, naming the file in errors.
pub struct Obj<'a> {
    pub path: &'a Path,
    pub value: &'a Value,
}

impl Obj<'_> {
    fn err(&self, key: &str, problem: impl Into<String>) -> HfError {
        HfError::Key {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            problem: problem.into(),
        }
    }

    /// The value of `key`, if present and not null.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.value.get(key).filter(|v| !v.is_null())
    }

    /// A non-negative integer key, if present.
    pub fn u64_opt(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                self.err(key, format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    /// A required non-negative integer key.
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.u64_opt(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    /// A number key, if present.
    pub fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a number, found {v}"))),
        }
    }

    /// A boolean key, if present.
    pub fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    /// A string key, if present.
    pub fn str_opt(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, format!("expected a string, found {v}"))),
        }
    }

    /// An error about `key` of this file.
    pub fn error(&self, key: &str, problem: impl Into<String>) -> HfError {
        self.err(key, problem)
    }
}
