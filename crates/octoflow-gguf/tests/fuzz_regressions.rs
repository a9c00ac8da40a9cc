//! Inputs the fuzzer (`fuzz/`, target `gguf_reader`) found to crash or break an invariant, kept
//! so the fixed bugs stay fixed. Each fixture is the minimized input from `fuzz/artifacts/`.

use std::path::{Path, PathBuf};

use octoflow_gguf::{parse_header, GgufError, GgufFile, GgufWriter};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz")
}

fn fixture(name: &str) -> Vec<u8> {
    let path = fixture_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A zero first dimension made the element count 0, so `[0, ~2^57, ~2^57, 197379]` passed the
/// overflow check and `TensorInfo::n_rows` later overflowed (a panic in debug builds).
#[test]
fn zero_dimension_does_not_hide_an_overflowing_row_count() {
    let err = GgufFile::from_bytes(fixture("zero_dim_hides_overflowing_rows.gguf")).unwrap_err();
    match &err {
        GgufError::BadTensor { tensor, problem } => {
            assert_eq!(tensor, "blk.6.w", "{err}");
            assert!(problem.contains("overflows"), "{err}");
        }
        other => panic!("expected BadTensor, got {other:?}"),
    }
}

/// A file without tensors but with `general.alignment = 2^29` is valid (the reader allows the
/// data section to start past the end when no tensor lives there), but writing it back padded
/// the header to 512 MiB (the fuzzer's timeout). Without tensors the writer adds no padding.
#[test]
fn tensorless_file_with_huge_alignment_writes_back_without_padding() {
    let bytes = fixture("tensorless_alignment_2pow29.gguf");
    let file = GgufFile::from_bytes(bytes).expect("a valid tensor-less file");
    assert_eq!(file.header().alignment, 1 << 29);
    assert!(file.tensors().is_empty());

    let mut written = Vec::new();
    GgufWriter::from_file(&file).write_to(&mut written).unwrap();
    assert!(written.len() < 4096, "wrote {} bytes", written.len());
    let again = GgufFile::from_bytes(written).unwrap();
    assert_eq!(again.header(), file.header());
}

/// Every kept input, including ones without a dedicated test above, is handled without a panic,
/// and `parse_header` and `GgufFile::from_bytes` agree on it.
#[test]
fn every_fuzz_fixture_is_handled_without_panicking() {
    let mut seen = 0;
    for entry in std::fs::read_dir(fixture_dir()).expect("fixtures/fuzz exists") {
        let path = entry.expect("readable directory entry").path();
        let bytes = std::fs::read(&path).expect("readable fixture");
        // Compared as text: a NaN metadata value is not equal to itself.
        let header = format!("{:?}", parse_header(&bytes));
        let file = format!(
            "{:?}",
            GgufFile::from_bytes(bytes).map(|f| f.header().clone())
        );
        assert_eq!(header, file, "{}", path.display());
        seen += 1;
    }
    assert!(seen > 0, "no fixtures found in {}", fixture_dir().display());
}
