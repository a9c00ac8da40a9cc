//! Our quant codecs against outside references: fixtures made by gguf-py 0.19, by ggml's C
//! reference quantizers, and from the first blocks of real tensors of the three models
//! (tests/fixtures/quant/make_fixtures.py says how they were made and how to remake them;
//! iq4_xs.bin, IQ4_XS blocks dequantized by gguf-py, was made later by the same script).

use std::collections::BTreeSet;

use octoflow_gguf::quant::{dequantize, dot_row, quantize};
use octoflow_gguf::GgmlType;

/// One fixture record: `bytes` is the quantized data of `n` elements; when `input` is present,
/// the reference quantized `input` to `bytes`; when `dequantized` is present, the reference
/// dequantized `bytes` to it.
struct Record {
    name: String,
    ty: GgmlType,
    n: usize,
    input: Option<Vec<f32>>,
    bytes: Vec<u8>,
    dequantized: Option<Vec<f32>>,
}

impl Record {
    fn source(&self) -> &str {
        self.name.split('/').next().unwrap_or("")
    }
}

struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
    file: &'a str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let end = self.at + n;
        assert!(
            end <= self.data.len(),
            "{}: truncated at byte {}",
            self.file,
            self.at
        );
        let s = &self.data[self.at..end];
        self.at = end;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        self.take(4 * n)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }
}

fn load(file: &str) -> Vec<Record> {
    let path = format!("{}/tests/fixtures/quant/{file}", env!("CARGO_MANIFEST_DIR"));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut c = Cursor {
        data: &data,
        at: 0,
        file,
    };
    assert_eq!(c.take(4), b"OFQF", "{file}: bad magic");
    assert_eq!(c.u32(), 1, "{file}: version");
    let count = c.u32();
    let records: Vec<Record> = (0..count)
        .map(|_| {
            let name_len = u16::from_le_bytes(c.take(2).try_into().unwrap()) as usize;
            let name = String::from_utf8(c.take(name_len).to_vec()).unwrap();
            let id = c.u32();
            let ty = GgmlType::from_u32(id).unwrap_or_else(|| panic!("{name}: type {id}"));
            let n = c.u32() as usize;
            let flags = c.take(1)[0];
            let input = (flags & 1 != 0).then(|| c.f32s(n));
            let n_bytes = c.u32() as usize;
            let bytes = c.take(n_bytes).to_vec();
            let dequantized = (flags & 2 != 0).then(|| c.f32s(n));
            Record {
                name,
                ty,
                n,
                input,
                bytes,
                dequantized,
            }
        })
        .collect();
    assert_eq!(c.at, data.len(), "{file}: trailing bytes");
    records
}

/// Bitwise equality, except that any NaN equals any NaN.
fn same_f32(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Checks every dequantization record; returns the types checked.
fn check_dequantize(records: &[Record]) -> BTreeSet<&'static str> {
    let mut checked = BTreeSet::new();
    for r in records {
        let Some(want) = &r.dequantized else { continue };
        let mut got = vec![0f32; r.n];
        dequantize(r.ty, &r.bytes, &mut got).unwrap_or_else(|e| panic!("{}: {e}", r.name));
        if let Some(i) = (0..r.n).find(|&i| !same_f32(got[i], want[i])) {
            panic!(
                "{}: element {i} (block {}) dequantizes to {:e} ({:#010x}), reference {:e} ({:#010x})",
                r.name,
                i / r.ty.block_size(),
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            );
        }
        check_dot_row(r, want);
        checked.insert(r.ty.name());
    }
    checked
}

/// The fused row dot must agree with dequantize-then-dot on the same data, to within the f32
/// rounding of a sum of `n` products. (Blocks whose values or products overflow f32 are left
/// out: the fused dot applies the scale after summing and may stay finite.)
fn check_dot_row(r: &Record, dequantized: &[f32]) {
    if !dequantized.iter().all(|v| v.is_finite()) {
        return;
    }
    let x: Vec<f32> = (0..r.n)
        .map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0)
        .collect();
    let fused = dot_row(r.ty, &r.bytes, &x).unwrap_or_else(|e| panic!("{}: {e}", r.name)) as f64;
    let (mut exact, mut magnitude) = (0f64, 0f64);
    for (&w, &x) in dequantized.iter().zip(&x) {
        exact += w as f64 * x as f64;
        magnitude += (w as f64 * x as f64).abs();
    }
    if magnitude > f32::MAX as f64 {
        return; // partial sums may overflow f32
    }
    let bound = 2.0 * r.n as f64 * f32::EPSILON as f64 * magnitude + f64::from(f32::MIN_POSITIVE);
    assert!(
        (fused - exact).abs() <= bound,
        "{}: dot_row {fused:e}, dequantize-then-dot {exact:e} (bound {bound:e})",
        r.name
    );
}

/// Checks every quantization record of `source`; returns the types checked.
fn check_quantize(records: &[Record], source: &str) -> BTreeSet<&'static str> {
    let mut checked = BTreeSet::new();
    for r in records.iter().filter(|r| r.source() == source) {
        let Some(input) = &r.input else { continue };
        let mut got = vec![0u8; r.bytes.len()];
        quantize(r.ty, input, &mut got).unwrap_or_else(|e| panic!("{}: {e}", r.name));
        if let Some(i) = (0..got.len()).find(|&i| got[i] != r.bytes[i]) {
            let ts = r.ty.type_size();
            panic!(
                "{}: byte {} of block {} is {:#04x}, reference {:#04x}\n ours: {:02x?}\n  ref: {:02x?}",
                r.name,
                i % ts,
                i / ts,
                got[i],
                r.bytes[i],
                &got[i / ts * ts..(i / ts + 1) * ts],
                &r.bytes[i / ts * ts..(i / ts + 1) * ts]
            );
        }
        checked.insert(r.ty.name());
    }
    checked
}

fn set(names: &[&'static str]) -> BTreeSet<&'static str> {
    names.iter().copied().collect()
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let mut records = load("synthetic.bin");
    records.extend(load("iq4_xs.bin"));
    let checked = check_dequantize(&records);
    let documented = set(&[
        "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
        "Q6_K", "MXFP4", "IQ4_NL", "IQ4_XS",
    ]);
    assert_eq!(checked, documented, "types verified against gguf-py");
}

#[test]
fn quantize_matches_gguf_py_bit_for_bit() {
    let checked = check_quantize(&load("synthetic.bin"), "gguf-py");
    let documented = set(&[
        "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4",
    ]);
    assert_eq!(checked, documented);
}

#[test]
fn quantize_matches_ggml_reference_quantizers_bit_for_bit() {
    let checked = check_quantize(&load("synthetic.bin"), "ggml");
    let documented = set(&["Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]);
    assert_eq!(checked, documented);
}

#[test]
fn real_model_tensors_dequantize_like_gguf_py() {
    let records = load("real.bin");
    let models: BTreeSet<&str> = records.iter().map(|r| r.source()).collect();
    assert_eq!(models.len(), 3, "records from the three models: {models:?}");
    let checked = check_dequantize(&records);
    assert_eq!(
        checked,
        set(&["F32", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"])
    );
}
