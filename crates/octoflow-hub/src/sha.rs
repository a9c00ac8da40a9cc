//! sha256 helpers: parsing expected digests, hashing files and streams.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{io_err, HubError};

/// Normalizes a user-supplied sha256 (64 hex digits, any case) to lowercase.
pub fn parse_sha256(value: &str) -> Result<String, HubError> {
    let v = value.trim();
    if v.len() == 64 && v.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(v.to_ascii_lowercase())
    } else {
        Err(HubError::BadSha256 {
            value: value.to_string(),
        })
    }
}

/// Lowercase hex of a finished digest.
pub(crate) fn to_hex(hasher: Sha256) -> String {
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// sha256 of a whole file, as 64 lowercase hex digits.
pub fn sha256_file(path: &Path) -> Result<String, HubError> {
    let mut file = File::open(path).map_err(io_err("open", path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io_err("read", path))?;
        if n == 0 {
            return Ok(to_hex(hasher));
        }
        hasher.update(&buf[..n]);
    }
}

/// A writer that hashes and counts everything passing through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// Bytes written so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The inner writer and the hex digest of everything written.
    pub(crate) fn finish(self) -> (W, String) {
        (self.inner, to_hex(self.hasher))
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha_argument_is_normalized_or_rejected() {
        let upper = "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855";
        assert_eq!(parse_sha256(upper).unwrap(), upper.to_ascii_lowercase());
        for bad in ["", "e3b0", &format!("{upper}00"), &upper.replace('E', "g")] {
            assert!(
                matches!(parse_sha256(bad), Err(HubError::BadSha256 { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn hashing_writer_matches_known_digest() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"abc").unwrap();
        assert_eq!(w.bytes(), 3);
        let (inner, hex) = w.finish();
        assert_eq!(inner, b"abc");
        assert_eq!(
            hex,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
