//! The integer-dot kernel's batches (`matvec_dot.comp`): one to eight tokens at the decode
//! shapes of qwen2.5-0.5B and Llama-3.1-8B against the path batches took before it (the f32
//! matvec, cooperative matrices with split-K from `COOP_MIN_TOKENS` where the device has them)
//! — and one token of Q8_0 at gpt-oss-20b's shapes, which the f32 matvec takes by default —
//! the same products on x quantized once for each (`Tuning::quantize_once`), and the product
//! with x neither read nor quantized (ABL_NOQ: the most that quantizing x once per product
//! group, instead of in every workgroup, could save). A child of linear_bench.rs (same feature,
//! same command): `cargo test -p octoflow-kernels --release --features bench --lib dot_batch
//! -- --ignored --nocapture --test-threads 1`; filter with `LINEAR_BENCH=q4_k`.

use octoflow_gguf::GgmlType;
use octoflow_vk::testing::gpu_with_integer_dot_or_skip;
use octoflow_vk::{Buffer, BufferSlice, Chain, MemoryKind, Shader};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::wall_ns;
use crate::glu::GluOp;
use crate::linear::{Linear, LinearArgs, LinearGluArgs, QWeightRef};
use crate::shaders;
use crate::testkit::{buffer_with, random_weights, with};
use crate::{DotBatches, Tuning};

/// The weights of a `rows` x `cols` matrix of `ty` at `data`.
fn weight(ty: GgmlType, data: &BufferSlice, rows: usize, cols: usize) -> QWeightRef<'_> {
    QWeightRef {
        ty,
        data,
        n_rows: rows as u32,
        n_cols: cols as u32,
    }
}

/// The ABL_NOQ variant of a type (plain or GLU), where it is built.
fn no_quant(ty: GgmlType, glu: bool) -> Option<Shader> {
    use GgmlType::*;
    Some(match (ty, glu) {
        (Q5_0, false) => shaders::MATVEC_DOT_X_NOQ_Q5_0,
        (Q5_0, true) => shaders::MATVEC_DOT_GLU_X_NOQ_Q5_0,
        (Q4_K, false) => shaders::MATVEC_DOT_X_NOQ_Q4_K,
        (Q4_K, true) => shaders::MATVEC_DOT_GLU_X_NOQ_Q4_K,
        (Q6_K, false) => shaders::MATVEC_DOT_X_NOQ_Q6_K,
        _ => return None,
    })
}

/// The largest |a - b| over the largest |b| (the 8-bit codes of x move a product by ~1e-2 of
/// its scale); NaN where either has one.
fn rel_diff(a: &[f32], b: &[f32]) -> String {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, |m, d| {
            if d.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        });
    format!("{:.1e}", worst / scale)
}

/// Wall time (µs) per product and the output of one run of it.
struct Timed {
    us: f64,
    y: Vec<f32>,
}

#[test]
#[ignore]
fn dot_batch_layouts() {
    let Some(ctx) = gpu_with_integer_dot_or_skip("dot_batch_layouts") else {
        return;
    };
    println!("device: {}", ctx.caps().name);
    let filter = std::env::var("LINEAR_BENCH").unwrap_or_default();
    // every product of 1 to 8 tokens on 8-bit dots (`once`: x quantized once for it), or none
    let tuned_with = |dot: bool, once: bool| {
        let t = Tuning {
            matvec_dot: dot,
            dot_min_weights: if dot { 0 } else { u64::MAX },
            dot_batches: if dot {
                DotBatches::All
            } else {
                DotBatches::Off
            },
            quantize_once: once,
            ..Tuning::from_caps(ctx.caps())
        };
        Linear::with_tuning(&ctx, t).unwrap()
    };
    let tuned = |dot: bool| tuned_with(dot, false);
    let cpu = ctx.caps().kind == octoflow_vk::DeviceKind::Cpu;
    let reps = if cpu { 2 } else { 400 };
    use GgmlType::*;
    // (type, rows, cols, fused norm, GLU)
    let shapes = [
        (Q5_0, 896, 896, true, false),
        (Q5_0, 128, 896, true, false),
        (Q5_0, 4864, 896, true, true),
        (Q6_K, 896, 4864, false, false),
        (Q4_K, 896, 4864, false, false),
        (Q4_K, 4096, 4096, true, false),
        (Q4_K, 1024, 4096, true, false),
        (Q4_K, 14336, 4096, true, true),
        (Q6_K, 4096, 14336, false, false),
        // gpt-oss-20b's attention projections and (a quarter of) its output matrix
        (Q8_0, 4096, 2880, true, false),
        (Q8_0, 512, 2880, true, false),
        (Q8_0, 2880, 4096, false, false),
        (Q8_0, 50272, 2880, true, false),
    ];
    let mut rng = StdRng::seed_from_u64(7);
    println!(
        "{:<5} {:>6} {:>6} {:>4} {:>2} | {:>8} {:>8} {:>8} {:>8} | largest difference / largest |before|",
        "type", "rows", "cols", "glu", "n", "dot µs", "once", "no-quant", "before"
    );
    for (ty, rows, cols, norm, glu) in shapes {
        if !filter.is_empty() && !ty.to_string().to_lowercase().contains(&filter) {
            continue;
        }
        let w = random_weights(&mut rng, ty, rows, cols);
        let u = random_weights(&mut rng, ty, rows, cols);
        let (wb, ub) = (buffer_with(&ctx, "w", &w), buffer_with(&ctx, "u", &u));
        let x: Vec<f32> = (0..8 * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let g: Vec<f32> = (0..cols).map(|_| rng.gen_range(0.5..1.5)).collect();
        let (xb, gb) = (with(&ctx, "x", &x), with(&ctx, "g", &g));
        let yb = Buffer::new(&ctx, "y", 4 * 8 * rows as u64, MemoryKind::DeviceLocal).unwrap();
        let (ws, us, xs, gs, ys) = (wb.whole(), ub.whole(), xb.whole(), gb.whole(), yb.whole());
        let time = |lin: &Linear, n: u32| -> Timed {
            // a fused norm where this path takes one (the previous path's batches on
            // cooperative matrices do not: their norm was a dispatch of its own)
            let nrm = (norm && lin.fuses_norm(n)).then_some((&gs, 1e-5f32));
            let rec = |chain: &mut Chain| {
                if glu {
                    let a = LinearGluArgs {
                        gate: weight(ty, &ws, rows, cols),
                        up: weight(ty, &us, rows, cols),
                        x: &xs,
                        y: &ys,
                        n_tokens: n,
                        op: GluOp::Silu,
                        norm: nrm,
                        pending: None,
                    };
                    lin.record_glu(chain, &a).unwrap();
                } else {
                    let a = LinearArgs {
                        w: weight(ty, &ws, rows, cols),
                        x: &xs,
                        y: &ys,
                        n_tokens: n,
                        y_stride: rows as u32,
                        y_col: 0,
                        bias: None,
                        accumulate: false,
                        norm: nrm,
                        pending: None,
                    };
                    lin.record(chain, &a).unwrap();
                }
            };
            let us = wall_ns(&ctx, reps, &rec) / 1e3;
            let mut chain = Chain::new(&ctx).unwrap();
            rec(&mut chain);
            chain.run().unwrap();
            Timed {
                us,
                y: crate::testkit::read(&ctx, &yb, n as usize * rows),
            }
        };
        for n in [1u32, 2, 4, 8] {
            let dot = time(&tuned(true), n);
            let once = time(&tuned_with(true, true), n).us;
            let before = time(&tuned(false), n);
            let noq = no_quant(ty, glu).map_or(f64::NAN, |sh| {
                time(&tuned(true).with_dot_variant(ty, glu, sh).unwrap(), n).us
            });
            println!(
                "{:<5} {rows:>6} {cols:>6} {:>4} {n:>2} | {:>8.2} {once:>8.2} {noq:>8.2} {:>8.2} | {}",
                ty.to_string(),
                if glu { "yes" } else { "" },
                dot.us,
                before.us,
                rel_diff(&dot.y, &before.y),
            );
        }
    }
}
