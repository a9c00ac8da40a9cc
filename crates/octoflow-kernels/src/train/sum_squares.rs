//! Sum of squares of a flat f32 vector (shader `sum_squares.comp`): the squared global gradient
//! norm that [`crate::AdamW`] clips with.
//!
//! One workgroup does the whole sum in a fixed order (per-invocation Kahan sums over a 256-strided
//! slice, then a pairwise tree), so a training run is bit-reproducible on a given device: no float
//! atomics, no order chosen by the driver.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::need;
use crate::shaders;

/// The sum-of-squares kernel, built once per device.
pub struct SumSquares {
    pipeline: Pipeline,
}

impl SumSquares {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(SumSquares {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::SUM_SQUARES, 2, 8))?,
        })
    }

    /// Records `out[out_offset] = Σ_{i<n} x[i]²` (f32 out; 0 for `n = 0`). ONE workgroup, fixed
    /// summation order: bit-identical results on every run (no float atomics) — training runs
    /// must be reproducible for checkpoint/resume tests.
    ///
    /// `x`: `[n]` f32. `out`: f32, at least `out_offset + 1` values; only `out[out_offset]` is
    /// written.
    pub fn record(
        &self,
        chain: &mut Chain,
        x: &BufferSlice,
        n: u32,
        out: &BufferSlice,
        out_offset: u32,
    ) -> Result<()> {
        need("sum_squares", "x", x, u128::from(n))?;
        need("sum_squares", "out", out, u128::from(out_offset) + 1)?;
        chain.dispatch(
            &self.pipeline,
            &[x.clone(), out.clone()],
            &Push::new().u32(n).u32(out_offset),
            [1, 1, 1],
        )?;
        Ok(())
    }
}

/// CPU reference: `Σ x[i]²`, accumulated in f64 (the exact value to within f64 rounding, which
/// the GPU's f32 result approximates).
pub fn sum_squares_ref(x: &[f32]) -> f64 {
    x.iter().map(|&v| f64::from(v) * f64::from(v)).sum()
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{poisoned, read, with};

    /// All terms are positive, so nothing cancels. Each invocation's Kahan sum is within ~2 ulp
    /// of its exact partial (2 × 6e-8), the 8-level pairwise tree over the 256 partials adds at
    /// most 8 roundings (8 × 6e-8), and each square is rounded once (3e-8): ≤ ~7e-7 relative
    /// in the worst case, whatever n. 2e-6 leaves room for the final f32 conversion.
    const REL: f32 = 2e-6;

    /// Runs the kernel over `x` into `out[out_offset]` of a NaN-poisoned buffer of
    /// `out_offset + 3` floats; returns the whole output buffer.
    fn run(ctx: &octoflow_vk::Context, x: &[f32], out_offset: u32) -> Vec<f32> {
        let xb = with(ctx, "x", x);
        let len = out_offset as usize + 3;
        let ob = poisoned(ctx, "out", len);
        let op = SumSquares::new(ctx).unwrap();
        let mut chain = Chain::new(ctx).unwrap();
        op.record(
            &mut chain,
            &xb.whole(),
            x.len() as u32,
            &ob.whole(),
            out_offset,
        )
        .unwrap();
        chain.run().unwrap();
        read(ctx, &ob, len)
    }

    #[test]
    fn gpu_sum_squares_matches_f64_and_is_bit_identical_across_runs() {
        let Some(ctx) = gpu_or_skip("gpu_sum_squares_matches_f64") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        for n in [1usize, 2, 255, 257, 1000, 1023, 2048, 2049, 3_000_001] {
            // Gradient-like values: mostly small, spread over a few orders of magnitude.
            let x: Vec<f32> = (0..n)
                .map(|_| rng.gen_range(-1.0f32..1.0) * 10f32.powf(rng.gen_range(-3.0..1.0)))
                .collect();
            let off = rng.gen_range(0..5u32);
            let first = run(&ctx, &x, off);
            let second = run(&ctx, &x, off);
            let o = off as usize;
            let want = sum_squares_ref(&x) as f32;
            if let Err(e) = check_close(&first[o..=o], &[want], REL) {
                panic!("sum_squares, n = {n}, seed {seed}: {e}");
            }
            assert_eq!(
                first[o].to_bits(),
                second[o].to_bits(),
                "sum_squares, n = {n}, seed {seed}: two runs differ"
            );
            // Only out[out_offset] is written.
            for (j, v) in first.iter().enumerate() {
                assert!(j == o || v.is_nan(), "n = {n}: out[{j}] = {v} was written");
            }
        }
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn empty_input_sums_to_zero() {
        let Some(ctx) = gpu_or_skip("empty_input_sums_to_zero") else {
            return;
        };
        let xb = with(&ctx, "x", &[7.0f32]);
        let ob = poisoned(&ctx, "out", 1);
        let op = SumSquares::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        op.record(&mut chain, &xb.whole(), 0, &ob.whole(), 0)
            .unwrap();
        chain.run().unwrap();
        assert_eq!(read(&ctx, &ob, 1), [0.0]);
    }

    #[test]
    fn short_operands_are_a_shape_error() {
        let Some(ctx) = gpu_or_skip("sum_squares_short_operands") else {
            return;
        };
        let xb = poisoned(&ctx, "grads", 10);
        let ob = poisoned(&ctx, "norms", 2);
        let op = SumSquares::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let err = op
            .record(&mut chain, &xb.whole(), 11, &ob.whole(), 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("grads") && err.contains("11 values"), "{err}");
        let err = op
            .record(&mut chain, &xb.whole(), 10, &ob.whole(), 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("norms") && err.contains("3 values"), "{err}");
    }
}
