//! Test support: a tiny in-memory SentencePiece tokenizer with ChatML specials, a ChatML
//! template, and the real models of the cache (`$OCTOFLOW_HOME/models`, default
//! `~/.cache/octoflow`), which tests skip with a note when absent.

#![allow(dead_code)]

use std::path::PathBuf;

use octoflow_gguf::{GgufFile, GgufWriter, Value};
use octoflow_text::{ChatTemplate, Tokenizer};

/// ChatML, as SmolLM2 and Qwen write it (without a default system message).
pub const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A SentencePiece (`llama`) tokenizer of `<unk> <s> </s> <|im_start|> <|im_end|>`, the 256
/// byte tokens and a few words, with BOS added and no space prefix.
pub fn tiny_tokenizer() -> Tokenizer {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    octoflow_model::testing::add_tiny_tokenizer(&mut w, None);
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).expect("writing the tiny tokenizer");
    let file = GgufFile::from_bytes(bytes).expect("parsing the tiny tokenizer");
    Tokenizer::from_gguf(&file).expect("building the tiny tokenizer")
}

/// The ChatML template with the tiny tokenizer's BOS/EOS texts.
pub fn chatml() -> ChatTemplate {
    ChatTemplate::from_source(CHATML, "test ChatML", "<s>", "</s>").expect("ChatML compiles")
}

/// A cached model's file, or `None` (with a note) when it is not in the cache.
pub fn cached_model(name: &str) -> Option<GgufFile> {
    let home = std::env::var_os("OCTOFLOW_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/octoflow")))?;
    let path = home.join("models").join(format!("{name}.gguf"));
    if !path.is_file() {
        eprintln!(
            "note: skipping: model {name} is not in the cache ({}); `octoflow pull` it",
            path.display()
        );
        return None;
    }
    Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// The real models the data tests run on.
pub const MODELS: [&str; 2] = [
    "smollm2-135m-instruct-q4_1",
    "qwen2.5-coder-0.5b-instruct-q4_k_m",
];

/// Writes `lines` (joined by newlines) to a temp file.
pub fn jsonl(dir: &tempfile::TempDir, name: &str, lines: &[&str]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, lines.join("\n") + "\n").expect("writing test data");
    path
}

/// A tiny random model of `arch` and `shape` with its matrices in Q8_0 (a quantized frozen
/// base for the training tests).
pub fn tiny_q8(
    arch: &str,
    shape: octoflow_model::testing::TinyShape,
    rng: &mut rand::rngs::StdRng,
) -> octoflow_model::Model {
    use octoflow_gguf::{quant, GgmlType};
    let mut w = octoflow_model::testing::tiny_writer(arch, shape, rng);
    for t in w.tensors_mut() {
        if t.dims.len() == 2 && t.ty == GgmlType::F32 && t.dims[0] % 32 == 0 {
            let f: Vec<f32> = t
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let mut q = vec![0u8; quant::quantized_size(GgmlType::Q8_0, f.len()).unwrap()];
            quant::quantize(GgmlType::Q8_0, &f, &mut q).unwrap();
            t.ty = GgmlType::Q8_0;
            t.data = std::borrow::Cow::Owned(q);
        }
    }
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    let file = std::sync::Arc::new(GgufFile::from_bytes(bytes).unwrap());
    octoflow_model::Model::from_gguf(file).unwrap()
}

/// Checks a step's adapter gradients `g` at parameters `p` against central differences of
/// `loss` (the f64 reference at given parameters) along random directions: each adapter's A
/// and B alone, then everything at once. Panics naming `name` past the bound; returns the
/// worst relative error.
pub fn check_directions(
    name: &str,
    layout: &octoflow_train::LoraLayout,
    p: &[f64],
    g: &[f32],
    loss: impl Fn(&[f64]) -> f64,
    rng: &mut rand::rngs::StdRng,
) -> f64 {
    use rand::Rng;
    // small: some directions are sharply curved (one measured f' 0.0771 where eps 1e-4 gave
    // 0.0770 and 1e-3 gave 0.062); f64 roundoff stays ~1e-11 at this step
    let eps = 1e-5;
    // measured worst on lavapipe: ~4e-5 (f32 accumulation against the f64 reference)
    let tol = 5e-4;
    let mut dirs: Vec<Vec<f64>> = Vec::new();
    for e in &layout.entries {
        for (from, to) in [(e.a, e.b), (e.b, e.b + e.n_out * layout.rank)] {
            let mut u = vec![0.0; layout.n_params];
            for v in &mut u[from..to] {
                *v = rng.gen_range(-1.0..1.0);
            }
            dirs.push(u);
        }
    }
    dirs.push(
        (0..layout.n_params)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect(),
    );
    let measured: Vec<(f64, f64, f64)> = dirs
        .iter()
        .map(|u| {
            let at = |s: f64| -> f64 {
                let shifted: Vec<f64> = p.iter().zip(u).map(|(p, d)| p + s * d).collect();
                loss(&shifted)
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps);
            let gu: f64 = g.iter().zip(u).map(|(&a, b)| f64::from(a) * b).sum();
            let scale: f64 = u.iter().map(|d| d * d).sum::<f64>().sqrt();
            (fd, gu, scale)
        })
        .collect();
    // the f32 step's roundoff follows the size of the sums it forms, which the steepest
    // direction shows, not the size of one direction's derivative: a direction whose terms
    // nearly cancel (a key adapter's B on some draws) keeps that absolute error, so the floor
    // is 1% of the steepest slope over the direction's length
    let slope = measured
        .iter()
        .map(|&(fd, _, scale)| fd.abs() / scale)
        .fold(0.0, f64::max);
    let mut worst = 0f64;
    for (i, &(fd, gu, scale)) in measured.iter().enumerate() {
        let err = (fd - gu).abs() / (fd.abs() + (1e-3f64).max(1e-2 * slope) * scale);
        worst = worst.max(err);
        let which = layout.entries.get(i / 2).map_or("all".to_string(), |e| {
            let m = if i % 2 == 0 { "A" } else { "B" };
            format!("blk.{} {} {m}", e.layer, e.target)
        });
        assert!(
            err < tol,
            "{name}: direction {i} ({which}): finite difference {fd:.6e}, gradient {gu:.6e} (rel {err:.2e})"
        );
    }
    worst
}

/// A micro-batch at positions `pos`: random ids and labels, every fifth row (from the fourth)
/// without a loss, the others weighted 1 / (rows with a loss).
pub fn random_rows(
    rng: &mut rand::rngs::StdRng,
    n_vocab: u32,
    pos: Vec<u32>,
) -> octoflow_train::Rows {
    use octoflow_kernels::IGNORE;
    use rand::Rng;
    let n = pos.len();
    let ids: Vec<u32> = (0..n).map(|_| rng.gen_range(0..n_vocab)).collect();
    let labels: Vec<u32> = (0..n)
        .map(|i| {
            if i % 5 == 3 {
                IGNORE
            } else {
                rng.gen_range(0..n_vocab)
            }
        })
        .collect();
    let k = labels.iter().filter(|&&l| l != IGNORE).count() as f32;
    let weights = labels
        .iter()
        .map(|&l| if l == IGNORE { 0.0 } else { 1.0 / k })
        .collect();
    octoflow_train::Rows {
        ids,
        labels,
        weights,
        pos,
    }
}
