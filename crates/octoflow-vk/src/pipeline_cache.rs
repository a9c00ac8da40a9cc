//! The pipeline cache on disk: compiled pipelines kept between runs, so a second start skips
//! the driver's shader compilation.
//!
//! One file per device and driver (`pipelines-<vendor>-<device>-<driver>-<uuid>.bin`, the
//! Vulkan identity of what the driver's blobs are valid for). It is read when the device is
//! opened ([`crate::Context::with_pipeline_cache`]) and written by
//! [`crate::Context::save_pipeline_cache`] to a temporary file that is fsynced and renamed, so a
//! reader never sees half a file. A missing, truncated, corrupt or foreign file is never an
//! error: drivers validate the data too, but not all of them gracefully, so the header is
//! checked here first and anything unexpected starts from an empty cache with a warning.

use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use ash::vk;

use crate::error::{Result, VkError};

/// Bytes of `VkPipelineCacheHeaderVersionOne`: length, version, vendor id, device id (u32 each,
/// little-endian on every platform we run on) and the 16-byte `pipelineCacheUUID`.
const HEADER_BYTES: usize = 32;

/// What a driver's cache data is valid for: a cache written for another identity is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheIdentity {
    pub vendor_id: u32,
    pub device_id: u32,
    pub driver_version: u32,
    pub uuid: [u8; vk::UUID_SIZE],
}

impl CacheIdentity {
    /// The identity of a physical device, from its properties.
    pub fn of(props: &vk::PhysicalDeviceProperties) -> Self {
        CacheIdentity {
            vendor_id: props.vendor_id,
            device_id: props.device_id,
            driver_version: props.driver_version,
            uuid: props.pipeline_cache_uuid,
        }
    }

    /// The cache file's name for this identity.
    pub fn file_name(&self) -> String {
        let mut uuid = String::with_capacity(2 * vk::UUID_SIZE);
        for b in self.uuid {
            let _ = write!(uuid, "{b:02x}");
        }
        format!(
            "pipelines-{:04x}-{:04x}-{:08x}-{uuid}.bin",
            self.vendor_id, self.device_id, self.driver_version
        )
    }
}

/// Where a context's pipeline cache started from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheLoad {
    /// No cache file was asked for ([`crate::Context::new`]).
    Off,
    /// The file does not exist yet (a first start).
    Missing(PathBuf),
    /// The file's `bytes` were given to the driver.
    Loaded { path: PathBuf, bytes: usize },
    /// The file was unreadable or not for this device; the cache started empty.
    Rejected { path: PathBuf, reason: String },
}

impl std::fmt::Display for CacheLoad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheLoad::Off => f.write_str("pipeline cache not on disk"),
            CacheLoad::Missing(p) => write!(f, "no pipeline cache yet at {}", p.display()),
            CacheLoad::Loaded { path, bytes } => write!(
                f,
                "pipeline cache of {bytes} bytes loaded from {}",
                path.display()
            ),
            CacheLoad::Rejected { path, reason } => write!(
                f,
                "pipeline cache {} ignored ({reason}); starting empty",
                path.display()
            ),
        }
    }
}

/// Why `data` is not a pipeline cache for `id`, or `None` when its header matches.
pub(crate) fn header_mismatch(data: &[u8], id: &CacheIdentity) -> Option<String> {
    if data.len() < HEADER_BYTES {
        return Some(format!(
            "{} bytes, shorter than the {HEADER_BYTES}-byte header",
            data.len()
        ));
    }
    let word = |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
    let (length, version, vendor, device) = (word(0), word(4), word(8), word(12));
    if (length as usize) < HEADER_BYTES || length as usize > data.len() {
        return Some(format!(
            "header length {length} (expected {HEADER_BYTES}..={} for a file of that size)",
            data.len()
        ));
    }
    if version != vk::PipelineCacheHeaderVersion::ONE.as_raw() as u32 {
        return Some(format!("header version {version}, expected 1"));
    }
    if (vendor, device) != (id.vendor_id, id.device_id) {
        return Some(format!(
            "written for vendor {vendor:#06x} device {device:#06x}, this is vendor {:#06x} device {:#06x}",
            id.vendor_id, id.device_id
        ));
    }
    if data[16..HEADER_BYTES] != id.uuid {
        return Some("written by another driver build (pipelineCacheUUID differs)".into());
    }
    None
}

/// The cache file for `id` in `dir`: its contents when they pass the header check (else empty),
/// and how the load went.
pub(crate) fn load(dir: &Path, id: &CacheIdentity) -> (Vec<u8>, CacheLoad) {
    let path = dir.join(id.file_name());
    let data = match fs::read(&path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return (Vec::new(), CacheLoad::Missing(path))
        }
        Err(e) => {
            let reason = format!("cannot read it: {e}");
            return (Vec::new(), CacheLoad::Rejected { path, reason });
        }
    };
    match header_mismatch(&data, id) {
        Some(reason) => (Vec::new(), CacheLoad::Rejected { path, reason }),
        None => {
            let bytes = data.len();
            (data, CacheLoad::Loaded { path, bytes })
        }
    }
}

/// Writes `data` as `path` atomically: a temporary file beside it (named per process, so two
/// processes saving at once do not mix their bytes), fsynced, then renamed over `path`. Skips
/// the write when the file already holds exactly `data`.
pub(crate) fn save(path: &Path, data: &[u8]) -> Result<bool> {
    let io = |what: &str, e: std::io::Error| VkError::PipelineCacheIo {
        path: path.to_path_buf(),
        detail: format!("{what}: {e}"),
    };
    if fs::read(path).is_ok_and(|old| old == data) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| io("creating its folder", e))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = File::create(&tmp)
        .and_then(|mut f| {
            f.write_all(data)?;
            f.sync_all()
        })
        .map_err(|e| io("writing a temporary file", e))
        .and_then(|()| fs::rename(&tmp, path).map_err(|e| io("renaming it into place", e)));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map(|()| true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> CacheIdentity {
        CacheIdentity {
            vendor_id: 0x10de,
            device_id: 0x2330,
            driver_version: 7,
            uuid: [3; 16],
        }
    }

    fn header(id: &CacheIdentity) -> Vec<u8> {
        let mut h = Vec::new();
        for w in [32u32, 1, id.vendor_id, id.device_id] {
            h.extend(w.to_le_bytes());
        }
        h.extend(id.uuid);
        h.extend([9u8; 40]); // the driver's blobs
        h
    }

    #[test]
    fn a_matching_header_passes_and_every_mismatch_is_named() {
        let good = header(&id());
        assert_eq!(header_mismatch(&good, &id()), None);
        type Spoil = dyn Fn(&mut Vec<u8>);
        let cases: [(&Spoil, &str); 5] = [
            (&|d| d.truncate(20), "shorter than"),
            (&|d| d[0] = 200, "header length"),
            (&|d| d[4] = 2, "version"),
            (&|d| d[8] = 0x02, "vendor"),
            (&|d| d[20] ^= 1, "pipelineCacheUUID"),
        ];
        for (spoil, expected) in cases {
            let mut d = good.clone();
            spoil(&mut d);
            let why = header_mismatch(&d, &id()).expect("a spoiled header is refused");
            assert!(why.contains(expected), "{why} (expected {expected:?})");
        }
    }

    #[test]
    fn file_names_separate_devices_and_driver_builds() {
        let a = id();
        let b = CacheIdentity {
            driver_version: 8,
            ..a
        };
        let mut c = a;
        c.uuid[15] = 4;
        let names = [a.file_name(), b.file_name(), c.file_name()];
        assert_eq!(
            names[0],
            "pipelines-10de-2330-00000007-03030303030303030303030303030303.bin"
        );
        assert!(names[0] != names[1] && names[0] != names[2] && names[1] != names[2]);
    }

    #[test]
    fn save_is_atomic_and_load_reads_back_or_starts_empty() {
        let dir = crate::tests::TempDir::new("pipeline_cache");
        let sub = dir.path().join("pipelines");
        let (data, how) = load(&sub, &id());
        assert!(
            data.is_empty() && matches!(how, CacheLoad::Missing(_)),
            "{how}"
        );
        let path = sub.join(id().file_name());
        let blob = header(&id());
        assert!(save(&path, &blob).unwrap(), "first save writes");
        assert!(
            !save(&path, &blob).unwrap(),
            "an unchanged cache is not rewritten"
        );
        let leftovers: Vec<_> = fs::read_dir(&sub).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
        let (data, how) = load(&sub, &id());
        assert_eq!(data, blob);
        assert_eq!(
            how,
            CacheLoad::Loaded {
                path: path.clone(),
                bytes: blob.len()
            }
        );
        fs::write(&path, b"not a cache").unwrap();
        let (data, how) = load(&sub, &id());
        assert!(
            data.is_empty() && matches!(how, CacheLoad::Rejected { .. }),
            "{how}"
        );
    }
}
