//! `octoflow bench --streams 1,8,32`: llama-batched-bench's table. For each stream count B,
//! B sequences of `--stream-prompt` prompt tokens are prefilled together (rows of several
//! sequences per step), then `--stream-gen` decode steps each generate one token for every
//! sequence (greedy, sampled on the GPU, fed back on the GPU, two steps in flight). Timed with
//! the host clock from the first submit to the last collected step.

use std::time::Instant;

use anyhow::{bail, Context};
use octoflow_core::Draw;
use octoflow_model::gpu::{GpuBatch, GpuModel};
use octoflow_model::{BatchForward, BatchRow, RowOutput, RowResult, TokenIn};
use serde_json::json;

/// Rows per prefill step.
const PREFILL_ROWS: usize = 512;

/// One stream count's result.
pub struct StreamRow {
    pub streams: usize,
    pub t_pp: f64,
    pub t_tg: f64,
}

const GREEDY: Draw = Draw::greedy(0);

/// Prefills every stream with `prompt` ids (its own per stream) and returns the first sampled
/// token of each.
fn prefill(
    b: &mut GpuBatch<'_>,
    streams: usize,
    npp: usize,
    vocab: u64,
    n_adapters: usize,
) -> anyhow::Result<Vec<u32>> {
    let mut all = Vec::with_capacity(streams * npp);
    for s in 0..streams {
        for p in 0..npp {
            let id = ((s as u64 * 104_729 + p as u64 * 7_919 + 13) % vocab) as u32;
            all.push(BatchRow {
                slot: s as u32,
                pos: p as u32,
                token: TokenIn::Id(id),
                output: if p + 1 == npp {
                    RowOutput::Sample(GREEDY)
                } else {
                    RowOutput::None
                },
                adapter: adapter_of(s, n_adapters),
            });
        }
    }
    let mut first = vec![0u32; streams];
    let step = b.max_rows().min(PREFILL_ROWS);
    let chunks: Vec<&[BatchRow]> = all.chunks(step).collect();
    let mut results = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        if b.pending() == octoflow_model::MAX_IN_FLIGHT {
            results.push((i - 2, b.collect()?));
        }
        b.submit(c)?;
    }
    while b.pending() > 0 {
        let i = chunks.len() - b.pending();
        results.push((i, b.collect()?));
    }
    for (i, r) in results {
        for (row, out) in chunks[i].iter().zip(r) {
            if let RowResult::Token { token, .. } = out {
                first[row.slot as usize] = token;
            }
        }
    }
    Ok(first)
}

/// With adapters loaded, stream `s` runs adapter `s mod n` (every stream adapted, the adapters
/// mixed in every step: multi-LoRA serving).
fn adapter_of(stream: usize, n_adapters: usize) -> Option<u32> {
    (n_adapters > 0).then(|| (stream % n_adapters) as u32)
}

/// Runs `ntg` decode steps over all streams, two in flight.
fn generate(
    b: &mut GpuBatch<'_>,
    first: &[u32],
    npp: usize,
    ntg: usize,
    n_adapters: usize,
) -> anyhow::Result<()> {
    for k in 0..ntg {
        let rows: Vec<BatchRow> = first
            .iter()
            .enumerate()
            .map(|(s, &t)| BatchRow {
                slot: s as u32,
                pos: (npp + k) as u32,
                token: if k == 0 {
                    TokenIn::Id(t)
                } else {
                    TokenIn::Sampled
                },
                output: RowOutput::Sample(GREEDY),
                adapter: adapter_of(s, n_adapters),
            })
            .collect();
        if b.pending() == octoflow_model::MAX_IN_FLIGHT {
            b.collect()?;
        }
        b.submit(&rows)?;
    }
    while b.pending() > 0 {
        b.collect()?;
    }
    Ok(())
}

/// Measures every stream count: warm-up passes (the first records the chains; more until
/// `warmup` seconds have passed, for the GPU's clocks), then the timed one.
pub fn measure(
    gpu: &GpuModel,
    streams: &[usize],
    npp: usize,
    ntg: usize,
    profile: bool,
    warmup: f64,
) -> anyhow::Result<Vec<StreamRow>> {
    if npp == 0 || ntg == 0 {
        bail!("--stream-prompt and --stream-gen must be at least 1");
    }
    let vocab = gpu.config.n_vocab as u64;
    let n_adapters = gpu.adapters().map_or(0, |a| a.n_adapters());
    let mut out = Vec::new();
    for &n in streams {
        if n == 0 {
            bail!("a stream count must be at least 1");
        }
        let rows = n.max(PREFILL_ROWS.min(n * npp));
        let mut b = gpu
            .batch(n, npp + ntg + 1, rows)
            .with_context(|| format!("{n} streams"))?;
        if b.max_outputs() < n {
            bail!(
                "{n} streams need {n} rows of logits per step; this device holds {}",
                b.max_outputs()
            );
        }
        let mut best = None;
        b.set_profiling(profile)?;
        let start = Instant::now();
        for rep in 0.. {
            let timed = rep > 0 && start.elapsed().as_secs_f64() >= warmup;
            let t0 = Instant::now();
            let first = prefill(&mut b, n, npp, vocab, n_adapters)?;
            let t1 = Instant::now();
            generate(&mut b, &first, npp, ntg, n_adapters)?;
            let t2 = Instant::now();
            if timed {
                best = Some(StreamRow {
                    streams: n,
                    t_pp: (t1 - t0).as_secs_f64(),
                    t_tg: (t2 - t1).as_secs_f64(),
                });
                break;
            }
        }
        if let Some(p) = b.profile() {
            eprintln!(
                "{n} streams, last decode step: {}",
                super::profile::table(p, 1)
            );
        }
        out.extend(best);
    }
    Ok(out)
}

/// Prints the rows as llama-batched-bench does (or JSON).
pub fn print(
    rows: &[StreamRow],
    npp: usize,
    ntg: usize,
    device: &str,
    json_out: bool,
) -> anyhow::Result<()> {
    if json_out {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                let (pp, tg) = ((r.streams * npp) as f64, (r.streams * ntg) as f64);
                json!({"pp": npp, "tg": ntg, "pl": r.streams, "n_kv": r.streams * (npp + ntg),
                       "t_pp": r.t_pp, "speed_pp": pp / r.t_pp, "t_tg": r.t_tg,
                       "speed_tg": tg / r.t_tg, "t": r.t_pp + r.t_tg,
                       "speed": (pp + tg) / (r.t_pp + r.t_tg)})
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"device": device, "batched": list}))?
        );
        return Ok(());
    }
    println!("device: {device}");
    println!(
        "| {:>6} | {:>6} | {:>4} | {:>6} | {:>8} | {:>9} | {:>8} | {:>9} | {:>8} | {:>9} |",
        "PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s"
    );
    println!(
        "|{:->8}|{:->8}|{:->6}|{:->8}|{:->10}|{:->11}|{:->10}|{:->11}|{:->10}|{:->11}|",
        "", "", "", "", "", "", "", "", "", ""
    );
    for r in rows {
        let (pp, tg) = ((r.streams * npp) as f64, (r.streams * ntg) as f64);
        let t = r.t_pp + r.t_tg;
        println!(
            "| {:>6} | {:>6} | {:>4} | {:>6} | {:>8.3} | {:>9.2} | {:>8.3} | {:>9.2} | {:>8.3} | {:>9.2} |",
            npp,
            ntg,
            r.streams,
            r.streams * (npp + ntg),
            r.t_pp,
            pp / r.t_pp,
            r.t_tg,
            tg / r.t_tg,
            t,
            (pp + tg) / t
        );
    }
    Ok(())
}
