//! Fuzzes the GGUF reader with arbitrary bytes. Beyond "never panics, hangs or allocates wildly",
//! it checks invariants, so the fuzzer finds logic bugs too:
//! - every tensor view lies inside the file and has the size the header promises;
//! - the key and tensor indexes find exactly what the header lists;
//! - whatever the reader accepts, the writer writes, and reading that back gives the same header
//!   (tensor offsets aside: the writer packs tensors in order) and the same tensor bytes;
//! - writing is idempotent: read + write of the writer's own output reproduces it byte for byte.

#![no_main]

use libfuzzer_sys::fuzz_target;
use octoflow_gguf::{GgufFile, GgufWriter, Header, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    touch_everything(&file);

    let mut written = Vec::new();
    GgufWriter::from_file(&file)
        .write_to(&mut written)
        .expect("the writer must accept every file the reader accepts");
    let again = GgufFile::from_bytes(written.clone())
        .expect("the reader must accept what the writer wrote");
    assert_same_header(file.header(), again.header());
    for (a, b) in file.tensors().iter().zip(again.tensors()) {
        assert!(
            file.tensor_data(a) == again.tensor_data(b),
            "tensor {:?}: data changed in the round trip",
            a.name
        );
    }

    let mut rewritten = Vec::new();
    GgufWriter::from_file(&again)
        .write_to(&mut rewritten)
        .expect("the writer must accept its own output");
    assert!(rewritten == written, "writing is not idempotent");
});

/// Reads every tensor byte and every metadata value through the public API.
fn touch_everything(file: &GgufFile) {
    let h = file.header();
    assert!(h.version == 2 || h.version == 3);
    assert!(h.alignment.is_power_of_two());
    assert_eq!(h.data_offset % h.alignment, 0);
    let mut sum = 0u8;
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.size, "tensor {:?}", t.name);
        sum = bytes.iter().fold(sum, |s, &b| s.wrapping_add(b));
        let indexed = file.tensor(&t.name).expect("every listed tensor is found");
        assert!(
            std::ptr::eq(indexed, t),
            "tensor {:?}: index finds another",
            t.name
        );
        let _ = (t.n_elements(), t.n_rows(), t.row_len());
    }
    for (key, value) in file.metadata() {
        let found = file.get(key).expect("every listed key is found");
        assert!(same_value(found, value), "key {key:?}");
        touch_value(value);
    }
    std::hint::black_box(sum);
}

fn touch_value(v: &Value) {
    std::hint::black_box((v.as_int(), v.as_f64(), v.as_bool(), v.as_str()));
    std::hint::black_box(v.type_description());
    std::hint::black_box(v.to_string());
    if let Some(items) = v.as_array() {
        items.iter().for_each(touch_value);
    }
}

/// Header equality with floats compared bit for bit (NaN payloads must survive) and tensor
/// offsets ignored (the writer packs tensors in order; their data is compared separately).
fn assert_same_header(a: &Header, b: &Header) {
    assert_eq!(a.version, b.version);
    assert_eq!(a.alignment, b.alignment);
    assert_eq!(a.data_offset, b.data_offset);
    assert_eq!(a.metadata.len(), b.metadata.len());
    for ((ka, va), (kb, vb)) in a.metadata.iter().zip(&b.metadata) {
        assert_eq!(ka, kb);
        assert!(same_value(va, vb), "key {ka:?}: {va} became {vb}");
    }
    assert_eq!(a.tensors.len(), b.tensors.len());
    for (ta, tb) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!(
            (&ta.name, &ta.dims, ta.ty, ta.size),
            (&tb.name, &tb.dims, tb.ty, tb.size)
        );
    }
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(ta, xs), Value::Array(tb, ys)) => {
            ta == tb && xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| same_value(x, y))
        }
        _ => a == b,
    }
}
