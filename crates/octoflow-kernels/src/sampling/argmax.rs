//! Argmax of one row of logits (shader `argmax.comp`): greedy decoding on the device.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::{KernelError, Result};
use crate::scratch::QueueScratch;
use crate::shaders;

/// Logits one workgroup scans at least (the row is cut into slices of this size or more).
const MIN_SLICE: u32 = 4096;
/// Most slices per row (the merging workgroup's 256 invocations take one each).
const MAX_SPLIT: u32 = 256;

/// The argmax kernel, built once per device. A long row is cut into slices scanned by separate
/// workgroups in one dispatch; the last to finish merges their candidates (see `argmax.comp`).
/// Like every split-K kernel here, argmax dispatches recorded for one queue share their scratch:
/// the caller puts a barrier between two of them.
pub struct Argmax {
    pipeline: Pipeline,
    part: QueueScratch,
    counts: QueueScratch,
}

impl Argmax {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Argmax {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::ARGMAX, 4, 16))?,
            part: QueueScratch::new("argmax_part"),
            counts: QueueScratch::zeroed("argmax_counts"),
        })
    }

    /// Slices per row for `n_vocab` logits.
    fn split(n_vocab: u32) -> u32 {
        n_vocab.div_ceil(MIN_SLICE).clamp(1, MAX_SPLIT)
    }

    /// Records `out[out_offset] = argmax_ref(logits[..n_vocab])`: the index of the largest logit
    /// (first on ties, NaN never chosen, 0 when nothing beats -inf), as a u32.
    /// `logits`: `[n_vocab]` f32 (`n_vocab >= 1`); `out`: u32, at least `out_offset + 1` of them.
    pub fn record(
        &self,
        chain: &mut Chain,
        logits: &BufferSlice,
        n_vocab: u32,
        out: &BufferSlice,
        out_offset: u32,
    ) -> Result<()> {
        self.record_rows(chain, logits, n_vocab, 1, out, out_offset)
    }

    /// [`Argmax::record`] of each row of `logits` (`[n_rows, n_vocab]`) into
    /// `out[out_offset + r]`, all rows in one dispatch.
    pub fn record_rows(
        &self,
        chain: &mut Chain,
        logits: &BufferSlice,
        n_vocab: u32,
        n_rows: u32,
        out: &BufferSlice,
        out_offset: u32,
    ) -> Result<()> {
        check_rows("argmax", logits, n_vocab, n_rows)?;
        check_out("argmax", out, out_offset, n_rows)?;
        let n_split = Self::split(n_vocab);
        let slice = n_vocab.div_ceil(n_split);
        let part = self
            .part
            .get_slice(chain, 8 * u64::from(n_split) * u64::from(n_rows))?;
        let counts = self.counts.get(chain, 4 * u64::from(n_rows))?;
        let groups = [n_split, n_rows, 1];
        let max = chain.context().caps().max_workgroup_count;
        if groups[1] > max[1] {
            let detail = format!("{n_rows} rows exceed the device's {} workgroups", max[1]);
            return Err(KernelError::Shape {
                op: "argmax",
                detail,
            });
        }
        chain.dispatch(
            &self.pipeline,
            &[logits.clone(), out.clone(), part, counts.whole()],
            &Push::new()
                .u32(n_vocab)
                .u32(out_offset)
                .u32(n_split)
                .u32(slice),
            groups,
        )?;
        Ok(())
    }
}

/// Checks that `logits` holds `n_rows` non-empty rows of `n_vocab` floats.
pub(crate) fn check_rows(
    op: &'static str,
    logits: &BufferSlice,
    n_vocab: u32,
    n_rows: u32,
) -> Result<()> {
    if n_vocab == 0 || n_rows == 0 {
        let detail =
            format!("n_vocab is {n_vocab} and n_rows {n_rows}: there is no token to choose");
        return Err(KernelError::Shape { op, detail });
    }
    let need = 4 * u64::from(n_vocab) * u64::from(n_rows);
    if logits.size < need {
        let detail = format!(
            "logits ({}) holds {} bytes, {n_rows} rows of {n_vocab} floats need {need}",
            logits.buffer.name(),
            logits.size,
        );
        return Err(KernelError::Shape { op, detail });
    }
    Ok(())
}

/// Checks that `out` holds u32 numbers `out_offset .. out_offset + n`.
pub(crate) fn check_out(
    op: &'static str,
    out: &BufferSlice,
    out_offset: u32,
    n: u32,
) -> Result<()> {
    let need = 4 * (u64::from(out_offset) + u64::from(n));
    if out.size < need {
        let detail = format!(
            "out ({}) holds {} bytes, out_offset {out_offset} and {n} values need {need}",
            out.buffer.name(),
            out.size
        );
        return Err(KernelError::Shape { op, detail });
    }
    Ok(())
}

/// CPU reference: the CPU sampler's own `argmax` (octoflow-core): the index of the first largest
/// value, compared with `>` from -inf at index 0 (so NaN is never chosen, -0.0 ties with +0.0,
/// and an all-NaN or all-(-inf) row gives 0).
pub fn argmax_ref(logits: &[f32]) -> u32 {
    octoflow_core::sampling::argmax(logits)
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use octoflow_vk::{Buffer, MemoryKind};
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Random logits with many exact ties (values drawn from a small set) and some NaNs,
    /// -inf and signed zeros.
    fn tricky_logits(rng: &mut impl Rng, n: usize) -> Vec<f32> {
        let levels = rng.gen_range(1..=20);
        let nan_frac = [0.0, 0.01, 0.3, 1.0][rng.gen_range(0..4)];
        (0..n)
            .map(|_| {
                let r: f64 = rng.gen();
                if r < nan_frac {
                    f32::NAN
                } else if r < nan_frac + 0.01 {
                    [f32::NEG_INFINITY, 0.0, -0.0][rng.gen_range(0..3)]
                } else if rng.gen_bool(0.5) {
                    rng.gen_range(0..levels) as f32 * 0.5 - 4.0
                } else {
                    rng.gen_range(-8.0f32..8.0)
                }
            })
            .collect()
    }

    #[test]
    fn gpu_argmax_matches_the_cpu_on_random_rows_with_ties_and_nans() {
        let Some(ctx) = gpu_or_skip("gpu_argmax_matches_the_cpu") else {
            return;
        };
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let argmax = Argmax::new(&ctx).unwrap();
        let sizes = [1usize, 2, 7, 255, 256, 1000, 1025, 49152, 151936, 262144];
        let rows: Vec<Vec<f32>> = sizes
            .iter()
            .flat_map(|&n| [n, n])
            .map(|n| tricky_logits(&mut rng, n))
            .collect();
        let logit_bufs: Vec<Buffer> = rows
            .iter()
            .map(|r| {
                let b = Buffer::new(&ctx, "logits", 4 * r.len() as u64, MemoryKind::DeviceLocal)
                    .unwrap();
                ctx.upload(&b, 0, r).unwrap();
                b
            })
            .collect();
        // All answers in one buffer at increasing offsets, poisoned first.
        let out = Buffer::new(&ctx, "out", 4 * rows.len() as u64, MemoryKind::DeviceLocal).unwrap();
        ctx.fill(&out, 0, out.size(), 0xFFFF_FFFF).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        for (i, (r, b)) in rows.iter().zip(&logit_bufs).enumerate() {
            argmax
                .record(
                    &mut chain,
                    &b.whole(),
                    r.len() as u32,
                    &out.whole(),
                    i as u32,
                )
                .unwrap();
            // argmax dispatches of one queue share their scratch
            chain.compute_barrier().unwrap();
        }
        chain.run().unwrap();
        // A replay of the chain (its counters back at zero) gives the same answers.
        ctx.fill(&out, 0, out.size(), 0xFFFF_FFFF).unwrap();
        chain.run().unwrap();
        let mut got = vec![0u32; rows.len()];
        ctx.download(&out, 0, &mut got).unwrap();
        for (i, r) in rows.iter().enumerate() {
            let want = argmax_ref(r);
            assert_eq!(
                got[i],
                want,
                "row {i} (n = {}), seed {seed}: GPU {} ({:?}) vs CPU {want} ({:?})",
                r.len(),
                got[i],
                r.get(got[i] as usize),
                r[want as usize]
            );
        }
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn gpu_argmax_of_many_rows_in_one_dispatch() {
        let Some(ctx) = gpu_or_skip("gpu_argmax_rows") else {
            return;
        };
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let argmax = Argmax::new(&ctx).unwrap();
        for (n_rows, n) in [(1usize, 1000usize), (37, 4099), (128, 49152)] {
            let rows: Vec<f32> = (0..n_rows)
                .flat_map(|_| tricky_logits(&mut rng, n))
                .collect();
            let b = Buffer::new(
                &ctx,
                "logits",
                4 * rows.len() as u64,
                MemoryKind::DeviceLocal,
            )
            .unwrap();
            ctx.upload(&b, 0, &rows).unwrap();
            let out = Buffer::new(
                &ctx,
                "out",
                4 * (n_rows as u64 + 3),
                MemoryKind::DeviceLocal,
            )
            .unwrap();
            ctx.fill(&out, 0, out.size(), 0xFFFF_FFFF).unwrap();
            let mut chain = Chain::new(&ctx).unwrap();
            argmax
                .record_rows(
                    &mut chain,
                    &b.whole(),
                    n as u32,
                    n_rows as u32,
                    &out.whole(),
                    3,
                )
                .unwrap();
            chain.run().unwrap();
            let mut got = vec![0u32; n_rows + 3];
            ctx.download(&out, 0, &mut got).unwrap();
            assert_eq!(
                &got[..3],
                &[u32::MAX; 3],
                "words before out_offset untouched"
            );
            for (r, row) in rows.chunks_exact(n).enumerate() {
                assert_eq!(
                    got[3 + r],
                    argmax_ref(row),
                    "row {r} of {n_rows}x{n}, seed {seed}"
                );
            }
        }
    }

    #[test]
    fn argmax_edge_rows() {
        let Some(ctx) = gpu_or_skip("argmax_edge_rows") else {
            return;
        };
        let argmax = Argmax::new(&ctx).unwrap();
        let nan = f32::NAN;
        let ninf = f32::NEG_INFINITY;
        let cases: Vec<(Vec<f32>, u32)> = vec![
            (vec![nan; 300], 0),
            (vec![ninf; 300], 0),
            (vec![nan, ninf, nan, -1e30], 3),
            (vec![-0.0, 0.0, -0.0], 0),
            (vec![1.0, f32::INFINITY, 2.0, f32::INFINITY], 1),
            (
                (0..5000)
                    .map(|i| if i == 4999 { 1.0 } else { 0.5 })
                    .collect(),
                4999,
            ),
        ];
        for (row, want) in cases {
            assert_eq!(argmax_ref(&row), want);
            let b = Buffer::new(
                &ctx,
                "logits",
                4 * row.len() as u64,
                MemoryKind::DeviceLocal,
            )
            .unwrap();
            ctx.upload(&b, 0, &row).unwrap();
            let out = Buffer::new(&ctx, "out", 4, MemoryKind::DeviceLocal).unwrap();
            ctx.fill(&out, 0, 4, 0xFFFF_FFFF).unwrap();
            let mut chain = Chain::new(&ctx).unwrap();
            argmax
                .record(&mut chain, &b.whole(), row.len() as u32, &out.whole(), 0)
                .unwrap();
            chain.run().unwrap();
            let mut got = [0u32];
            ctx.download(&out, 0, &mut got).unwrap();
            assert_eq!(
                got[0],
                want,
                "row of {} starting {:?}",
                row.len(),
                &row[..3]
            );
        }
    }

    #[test]
    fn bad_shapes_are_clear_errors() {
        let Some(ctx) = gpu_or_skip("argmax_bad_shapes") else {
            return;
        };
        let small = Buffer::new(&ctx, "small", 16, MemoryKind::DeviceLocal).unwrap();
        let argmax = Argmax::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let w = small.whole();
        let err = argmax
            .record(&mut chain, &w, 5, &w, 0)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("logits (small)") && err.contains("5 floats"),
            "{err}"
        );
        let err = argmax
            .record(&mut chain, &w, 4, &w, 4)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("out (small)") && err.contains("out_offset 4"),
            "{err}"
        );
        let err = argmax
            .record(&mut chain, &w, 0, &w, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("n_vocab is 0"), "{err}");
    }
}
