//! The reader and writer as a specification: what round-trips, and how each kind of damage to a
//! file is reported.

use octoflow_gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value, ValueType};

/// A small file with every value type, a nested array and two tensors.
fn sample() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("u8", Value::U8(7));
    w.set("i8", Value::I8(-7));
    w.set("u16", Value::U16(700));
    w.set("i16", Value::I16(-700));
    w.set("u32", Value::U32(70_000));
    w.set("i32", Value::I32(-70_000));
    w.set("f32", Value::F32(1.5));
    w.set("bool", Value::Bool(true));
    w.set("u64", Value::U64(1 << 40));
    w.set("i64", Value::I64(-(1 << 40)));
    w.set("f64", Value::F64(-2.25));
    w.set(
        "strings",
        Value::Array(
            ValueType::String,
            vec![Value::String("a".into()), Value::String("ü".into())],
        ),
    );
    w.set(
        "nested",
        Value::Array(
            ValueType::Array,
            vec![
                Value::Array(ValueType::I32, vec![Value::I32(1), Value::I32(2)]),
                Value::Array(ValueType::I32, vec![]),
            ],
        ),
    );
    w.add_tensor("a", GgmlType::F32, &[3, 2], vec![1u8; 24])
        .unwrap();
    w.add_tensor("b", GgmlType::Q8_0, &[64], vec![2u8; 68])
        .unwrap();
    let mut out = Vec::new();
    w.write_to(&mut out).unwrap();
    out
}

#[test]
fn every_value_type_and_nested_arrays_round_trip() {
    let bytes = sample();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("u32").unwrap(), 70_000);
    assert_eq!(f.get_u64("u64").unwrap(), 1 << 40);
    assert_eq!(f.get_f32("f64").unwrap(), -2.25);
    assert!(f.get_bool("bool").unwrap());
    assert_eq!(f.get_array("nested").unwrap().len(), 2);
    let a = f.require_tensor("a").unwrap();
    assert_eq!(
        (a.dims.as_slice(), a.ty, a.size),
        (&[3u64, 2][..], GgmlType::F32, 24)
    );
    assert_eq!(f.tensor_data(a), &[1u8; 24][..]);
    let b = f.require_tensor("b").unwrap();
    assert_eq!(b.offset % 32, 0);
    assert_eq!(f.tensor_data(b), &[2u8; 68][..]);

    let mut again = Vec::new();
    GgufWriter::from_file(&f).write_to(&mut again).unwrap();
    assert_eq!(
        again, bytes,
        "read + write must reproduce the file byte for byte"
    );
}

#[test]
fn typed_getters_say_what_was_expected() {
    let f = GgufFile::from_bytes(sample()).unwrap();
    let err = f.get_str("u32").unwrap_err().to_string();
    assert!(
        err.contains("\"u32\"") && err.contains("expected string"),
        "{err}"
    );
    assert!(matches!(f.get_u32("i32"), Err(GgufError::WrongType { .. })));
    assert!(matches!(f.get_u32("nope"), Err(GgufError::MissingKey(k)) if k == "nope"));
    assert!(matches!(
        f.require_tensor("c"),
        Err(GgufError::MissingTensor(_))
    ));
}

#[test]
fn every_truncation_is_a_clear_error() {
    let bytes = sample();
    // Only the zero padding after the last tensor's data may be cut without losing anything.
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let last = f.tensors().last().unwrap();
    let end = (f.header().data_offset + last.offset + last.size) as usize;
    assert!(GgufFile::from_bytes(bytes[..end].to_vec()).is_ok());
    for len in 0..end {
        let r = GgufFile::from_bytes(bytes[..len].to_vec());
        assert!(r.is_err(), "a file cut to {len} bytes must not parse");
    }
}

#[test]
fn bad_magic_and_versions_are_rejected() {
    let mut b = sample();
    b[0] = b'X';
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::BadMagic { .. })
    ));
    for (v, big) in [(1u32, false), (4, false), (3u32.swap_bytes(), true)] {
        let mut b = sample();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        let r = GgufFile::from_bytes(b);
        if big {
            assert!(matches!(r, Err(GgufError::BigEndian)), "{r:?}");
        } else {
            assert!(
                matches!(r, Err(GgufError::UnsupportedVersion(x)) if x == v),
                "{r:?}"
            );
        }
    }
}

/// Overwrites the u64 at `at`.
fn patch_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Offset of the first occurrence of `needle`.
fn find(b: &[u8], needle: &[u8]) -> usize {
    b.windows(needle.len()).position(|w| w == needle).unwrap()
}

#[test]
fn absurd_counts_and_lengths_fail_without_allocating() {
    for at in [8usize, 16] {
        let mut b = sample();
        patch_u64(&mut b, at, u64::MAX / 2);
        assert!(matches!(
            GgufFile::from_bytes(b),
            Err(GgufError::ImplausibleCount { .. })
        ));
    }
    // The length prefix of the first key.
    let mut b = sample();
    patch_u64(&mut b, 24, 1 << 60);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::Truncated { .. })
    ));
    // The element count of the string array.
    let mut b = sample();
    let at = find(&b, b"strings") + 7 + 4;
    patch_u64(&mut b, at, 1 << 62);
    let r = GgufFile::from_bytes(b);
    assert!(
        matches!(r, Err(GgufError::ImplausibleCount { ref what, .. }) if what.contains("strings")),
        "{r:?}"
    );
}

#[test]
fn unknown_value_and_tensor_types_are_named() {
    let mut b = sample();
    let at = find(&b, b"u8") + 2;
    b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    let r = GgufFile::from_bytes(b);
    assert!(
        matches!(r, Err(GgufError::UnknownValueType { ref key, type_id: 99 }) if key == "u8"),
        "{r:?}"
    );

    let mut b = sample();
    // Tensor "b": name, n_dims=1, dim 64, then the type id.
    let at = find(&b, b"\x01\0\0\0\0\0\0\0b\x01\0\0\0") + 13 + 8;
    b[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
    let r = GgufFile::from_bytes(b);
    assert!(
        matches!(r, Err(GgufError::UnknownTensorType { ref tensor, type_id: 5 }) if tensor == "b"),
        "{r:?}"
    );
}

#[test]
fn tensor_offsets_outside_the_file_or_misaligned_are_rejected() {
    let base = sample();
    let at = find(&base, b"\x01\0\0\0\0\0\0\0b\x01\0\0\0") + 13 + 8 + 4;
    let mut b = base.clone();
    patch_u64(&mut b, at, 1 << 20);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
    let mut b = base.clone();
    patch_u64(&mut b, at, u64::MAX - 3);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::MisalignedTensor { .. })
    ));
    let mut b = base;
    patch_u64(&mut b, at, u64::MAX - 31);
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
}

#[test]
fn shapes_must_be_whole_blocks() {
    let mut w = GgufWriter::new();
    let r = w.add_tensor("x", GgmlType::Q4_K, &[100], vec![0u8; 144]);
    assert!(matches!(r, Err(GgufError::BadTensor { .. })));
    let r = w.add_tensor("y", GgmlType::F16, &[4], vec![0u8; 7]);
    assert!(matches!(r, Err(GgufError::BadTensor { .. })));
}

#[test]
fn custom_alignment_is_honoured_and_checked() {
    let mut w = GgufWriter::new();
    w.set("general.alignment", Value::U32(64));
    w.add_tensor("a", GgmlType::F32, &[3], vec![0u8; 12])
        .unwrap();
    w.add_tensor("b", GgmlType::F32, &[3], vec![0u8; 12])
        .unwrap();
    let mut out = Vec::new();
    w.write_to(&mut out).unwrap();
    let f = GgufFile::from_bytes(out).unwrap();
    assert_eq!(f.header().alignment, 64);
    assert_eq!(f.header().data_offset % 64, 0);
    assert_eq!(f.require_tensor("b").unwrap().offset, 64);

    let mut w = GgufWriter::new();
    w.set("general.alignment", Value::U32(48));
    assert!(matches!(
        w.write_to(&mut Vec::new()),
        Err(GgufError::BadAlignment { .. })
    ));
}

#[test]
fn deeply_nested_arrays_are_rejected() {
    let mut v = Value::Array(ValueType::U8, vec![]);
    for _ in 0..20 {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    let mut w = GgufWriter::new();
    w.set("deep", v);
    let mut out = Vec::new();
    w.write_to(&mut out).unwrap();
    assert!(matches!(
        GgufFile::from_bytes(out),
        Err(GgufError::NestingTooDeep { .. })
    ));
}

#[test]
fn duplicate_keys_are_rejected() {
    let mut b = sample();
    // Rename key "i8" to "u8" so it duplicates the previous key.
    let at = find(&b, b"i8\x01\0\0\0");
    b[at] = b'u';
    assert!(matches!(
        GgufFile::from_bytes(b),
        Err(GgufError::DuplicateKey { .. })
    ));
}

#[test]
fn writing_a_file_is_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.gguf");
    let f = GgufFile::from_bytes(sample()).unwrap();
    GgufWriter::from_file(&f).write_file(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), sample());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
}
