//! Writes the fuzzer's seed corpus.
//!
//! `make_seeds SEED_DIR [PREFIX_DIR]` writes into SEED_DIR small valid files made by our writer
//! (every value type, nested arrays, v2 and v3, a non-default alignment, many tensor types) and,
//! for each model found in `$OCTOFLOW_HOME/models` (default `~/.cache/octoflow/models`), a
//! header-only file with that model's keys (arrays cut to a few elements, strings shortened) and a
//! few of its tensor infos with tiny shapes. With PREFIX_DIR it also copies the first 64 KiB of
//! each model there: not valid files by themselves (the data is missing), but real headers; they
//! are too big to commit, so they go into the uncommitted working corpus.

use std::path::{Path, PathBuf};

use octoflow_gguf::{GgmlType, GgufFile, GgufWriter, Value, ValueType};

const PREFIX_LEN: usize = 64 * 1024;
const KEPT_ARRAY_ITEMS: usize = 4;
const KEPT_STRING_BYTES: usize = 48;
const KEPT_TENSORS: usize = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(seed_dir) = args.first().map(PathBuf::from) else {
        return Err("usage: make_seeds SEED_DIR [PREFIX_DIR]".into());
    };
    std::fs::create_dir_all(&seed_dir)?;
    write(&seed_dir.join("all_value_types_v3.gguf"), all_value_types())?;
    write(
        &seed_dir.join("many_tensor_types_v2_align64.gguf"),
        many_tensor_types(),
    )?;
    write(&seed_dir.join("empty_v3.gguf"), GgufWriter::new())?;

    for model in models()? {
        let stem = model
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("model");
        let file = GgufFile::open(&model)?;
        write(
            &seed_dir.join(format!("{stem}.header.gguf")),
            header_only(&file)?,
        )?;
        if let Some(dir) = args.get(1).map(PathBuf::from) {
            std::fs::create_dir_all(&dir)?;
            let bytes = file.bytes();
            let prefix = &bytes[..bytes.len().min(PREFIX_LEN)];
            std::fs::write(dir.join(format!("{stem}.prefix64k")), prefix)?;
        }
    }
    Ok(())
}

fn write(path: &Path, w: GgufWriter<'_>) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = Vec::new();
    w.write_to(&mut out)?;
    std::fs::write(path, &out)?;
    println!("{} ({} bytes)", path.display(), out.len());
    Ok(())
}

fn all_value_types() -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("general.alignment", Value::U32(32));
    w.set("u8", Value::U8(7));
    w.set("i8", Value::I8(-7));
    w.set("u16", Value::U16(700));
    w.set("i16", Value::I16(-700));
    w.set("u32", Value::U32(70_000));
    w.set("i32", Value::I32(-70_000));
    w.set("f32", Value::F32(f32::NAN));
    w.set("bool", Value::Bool(true));
    w.set("u64", Value::U64(1 << 40));
    w.set("i64", Value::I64(-(1 << 40)));
    w.set("f64", Value::F64(-2.25));
    let strings = ["a", "ü", ""].map(|s| Value::String(s.into()));
    w.set("strings", Value::Array(ValueType::String, strings.to_vec()));
    let inner =
        |xs: &[i32]| Value::Array(ValueType::I32, xs.iter().map(|&x| Value::I32(x)).collect());
    let nested = vec![inner(&[1, 2]), inner(&[])];
    w.set("nested", Value::Array(ValueType::Array, nested));
    // Tensor data of the right size for each shape; the writer checks it.
    w.add_tensor("a", GgmlType::F32, &[3, 2], vec![1u8; 24])
        .expect("24 bytes is F32 [3, 2]");
    w.add_tensor("b", GgmlType::Q8_0, &[64], vec![2u8; 68])
        .expect("68 bytes is Q8_0 [64]");
    w
}

fn many_tensor_types() -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    w.set_version(2).expect("2 is supported");
    w.set("general.alignment", Value::U32(64));
    let types = [
        GgmlType::F16,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::MXFP4,
        GgmlType::I8,
    ];
    for (i, ty) in types.into_iter().enumerate() {
        let dims = [ty.block_size() as u64, 1, 1, 1];
        let size = ty.type_size();
        w.add_tensor(
            format!("blk.{i}.w"),
            ty,
            &dims[..=i % 4],
            vec![i as u8; size],
        )
        .expect("one block of each type");
    }
    w
}

/// A model's metadata (shortened) and its first tensor infos with one-block shapes.
fn header_only(file: &GgufFile) -> Result<GgufWriter<'static>, Box<dyn std::error::Error>> {
    let mut w = GgufWriter::new();
    w.set_version(file.version())?;
    for (key, value) in file.metadata() {
        w.set(key.clone(), shorten(value));
    }
    for t in file.tensors().iter().take(KEPT_TENSORS) {
        let dims: Vec<u64> = t
            .dims
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { t.ty.block_size() as u64 } else { 2 })
            .collect();
        let size =
            octoflow_gguf::writer::expected_size(t.ty, &dims).ok_or("tiny shape overflows")?;
        w.add_tensor(t.name.clone(), t.ty, &dims, vec![0u8; size as usize])?;
    }
    Ok(w)
}

fn shorten(v: &Value) -> Value {
    match v {
        Value::String(s) => {
            let mut end = s.len().min(KEPT_STRING_BYTES);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            Value::String(s[..end].to_string())
        }
        Value::Array(ty, items) => Value::Array(
            *ty,
            items.iter().take(KEPT_ARRAY_ITEMS).map(shorten).collect(),
        ),
        v => v.clone(),
    }
}

fn models() -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    let home = match std::env::var_os("OCTOFLOW_HOME") {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set")?)
            .join(".cache/octoflow"),
    };
    let dir = home.join("models");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!(
            "no models in {}: writing only the synthetic seeds",
            dir.display()
        );
        return Ok(Vec::new());
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    found.sort();
    Ok(found)
}
