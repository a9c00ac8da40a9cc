//! `octoflow inspect FILE`: metadata and tensor table, like gguf-dump.

use octoflow_gguf::{GgufFile, Value};
use serde_json::json;

/// Arguments of `octoflow inspect`.
#[derive(clap::Args)]
pub struct Args {
    /// A .gguf path, a Hugging Face folder, a known model name or a URL.
    model: String,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// With --json: include the full contents of arrays (e.g. the vocabulary).
    #[arg(long)]
    json_array: bool,
    /// Print only the metadata.
    #[arg(long)]
    no_tensors: bool,
}

/// Runs `octoflow inspect`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let (path, file) = super::common::open_gguf(Some(&args.model))?;
    if args.json {
        let doc = to_json(&file, args.json_array, !args.no_tensors);
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let h = file.header();
    println!("* {}", path.display());
    println!(
        "* GGUF v{}, {} bytes, alignment {}, data at byte {}",
        h.version,
        file.bytes().len(),
        h.alignment,
        h.data_offset
    );
    println!("* {} key/value pairs", h.metadata.len());
    for (i, (key, value)) in h.metadata.iter().enumerate() {
        let count = value.as_array().map_or(1, <[Value]>::len);
        println!(
            "{:>6}: {:<14} | {:>8} | {} = {}",
            i + 1,
            value.type_description(),
            count,
            key,
            value
        );
    }
    if args.no_tensors {
        return Ok(());
    }
    println!("* {} tensors", h.tensors.len());
    println!(
        "{:>6}  {:<8} {:>24} {:>12} {:>12}  name",
        "#", "type", "shape", "elements", "bytes"
    );
    let mut total = 0u64;
    for (i, t) in h.tensors.iter().enumerate() {
        let shape = t
            .dims
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" x ");
        println!(
            "{:>6}  {:<8} {:>24} {:>12} {:>12}  {}",
            i + 1,
            t.ty.name(),
            shape,
            t.n_elements(),
            t.size,
            t.name
        );
        total += t.size;
    }
    println!("* tensor data: {total} bytes");
    Ok(())
}

fn to_json(file: &GgufFile, full_arrays: bool, tensors: bool) -> serde_json::Value {
    let h = file.header();
    let metadata: serde_json::Map<String, serde_json::Value> = h
        .metadata
        .iter()
        .map(|(k, v)| {
            let entry = match v {
                Value::Array(_, items) if !full_arrays => {
                    json!({ "type": v.type_description(), "len": items.len() })
                }
                _ => json!({ "type": v.type_description(), "value": value_json(v) }),
            };
            (k.clone(), entry)
        })
        .collect();
    let mut doc = json!({
        "version": h.version,
        "alignment": h.alignment,
        "data_offset": h.data_offset,
        "file_size": file.bytes().len(),
        "metadata": metadata,
    });
    if tensors {
        doc["tensors"] = h
            .tensors
            .iter()
            .map(|t| {
                json!({
                    "name": t.name, "type": t.ty.name(), "shape": t.dims,
                    "elements": t.n_elements(), "bytes": t.size, "offset": t.offset,
                })
            })
            .collect();
    }
    doc
}

fn value_json(v: &Value) -> serde_json::Value {
    match v {
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Array(_, items) => items.iter().map(value_json).collect(),
        other => other
            .as_int()
            .map_or(serde_json::Value::Null, |i| match i64::try_from(i) {
                Ok(i) => json!(i),
                Err(_) => json!(i as u64),
            }),
    }
}
