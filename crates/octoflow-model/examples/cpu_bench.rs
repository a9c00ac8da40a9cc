//! Times the CPU reference on a model: prefill and decode throughput, and the per-type cost of
//! the fused dot versus dequantization (the two matmul paths).
//!
//! `cargo run --release -p octoflow-model --example cpu_bench -- MODEL.gguf [PREFILL] [DECODE]`

use std::time::Instant;

use octoflow_gguf::quant;
use octoflow_model::ops::argmax;
use octoflow_model::{Forward, Model, QMatrix};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: cpu_bench MODEL.gguf [PREFILL] [DECODE]")?;
    let n_prefill: usize = args.next().map_or(Ok(128), |s| s.parse())?;
    let n_decode: usize = args.next().map_or(Ok(16), |s| s.parse())?;
    let model = Model::open(&path)?;
    let c = &model.config;
    println!(
        "{} layers={} embd={} ff={} vocab={}",
        c.arch, c.n_layer, c.n_embd, c.n_ff, c.n_vocab
    );

    let blk = &model.weights.blk[0];
    let glu = blk.glu()?;
    for m in [
        &blk.attn_q,
        &glu.ffn_up,
        &glu.ffn_down,
        &model.weights.output,
    ] {
        time_matrix(m)?;
    }

    let prompt: Vec<u32> = (0..n_prefill as u32).map(|i| 100 + i * 7 % 1000).collect();
    let mut s = model.session(n_prefill + n_decode);
    let t = Instant::now();
    let logits = s.prefill(&prompt, 256)?;
    let dt = t.elapsed().as_secs_f64();
    println!(
        "prefill {n_prefill} tokens: {dt:.2}s, {:.1} tok/s",
        n_prefill as f64 / dt
    );
    let mut next = argmax(&logits).map_or(0, |(i, _)| i as u32);
    let t = Instant::now();
    for _ in 0..n_decode {
        next = argmax(&s.decode(next)?).map_or(0, |(i, _)| i as u32);
    }
    let dt = t.elapsed().as_secs_f64();
    println!(
        "decode {n_decode} tokens: {:.1} ms/token",
        1e3 * dt / n_decode as f64
    );
    Ok(())
}

/// Single-thread time per row of the fused dot and of dequantization.
fn time_matrix(m: &QMatrix) -> Result<(), Box<dyn std::error::Error>> {
    let x: Vec<f32> = (0..m.n_cols).map(|i| (i as f32).sin()).collect();
    let rows = m.n_rows.min(2048);
    let t = Instant::now();
    let mut acc = 0f32;
    for r in 0..rows {
        acc += quant::dot_row(m.ty, m.row(r), &x)?;
    }
    let dot = t.elapsed().as_secs_f64();
    let mut buf = vec![0f32; m.n_cols];
    let t = Instant::now();
    for r in 0..rows {
        m.dequantize_rows(r, &mut buf)?;
        acc += buf[0];
    }
    let deq = t.elapsed().as_secs_f64();
    let gmac = (rows * m.n_cols) as f64 / 1e9;
    println!(
        "{:<24} {:>5}: dot {:.2} GMAC/s, dequantize {:.2} Gelem/s ({acc:.1})",
        m.name,
        m.ty.name(),
        gmac / dot,
        gmac / deq
    );
    Ok(())
}
