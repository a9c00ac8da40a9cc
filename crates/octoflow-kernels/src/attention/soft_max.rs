//! Row softmax (shader `soft_max.comp`): `out[r] = softmax(scale * x[r])`, max-subtracted.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

/// The softmax kernel, built once per device.
pub struct SoftMax {
    pipeline: Pipeline,
}

impl SoftMax {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(SoftMax {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::SOFT_MAX, 2, 12))?,
        })
    }

    /// out[r] = softmax(scale * x[r]) per row, max-subtracted. x,out [n_rows, n] f32 (may alias).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        chain: &mut Chain,
        x: &BufferSlice,
        out: &BufferSlice,
        n_rows: u32,
        n: u32,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "soft_max";
        if n == 0 || n_rows == 0 {
            return Err(bad(OP, format!("empty shape: {n_rows} rows of {n}")));
        }
        let total = u128::from(n_rows) * u128::from(n);
        need(OP, "x", x, total)?;
        need(OP, "out", out, total)?;
        let groups = chain.context().groups_1d(u64::from(n_rows), 1)?;
        chain.dispatch(
            &self.pipeline,
            &[x.clone(), out.clone()],
            &Push::new().u32(n_rows).u32(n).f32(scale),
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: softmax of `scale * x` over every `n`-wide row (`[rows, n]`) into `out`
/// (the normalizing sum in f64, so the reference does not drift on 50k-wide rows).
pub fn soft_max_ref(x: &[f32], out: &mut [f32], n: usize, scale: f32) {
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let max = xr
            .iter()
            .map(|&v| scale * v)
            .fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f64;
        for (o, &v) in or.iter_mut().zip(xr) {
            *o = (scale * v - max).exp();
            sum += f64::from(*o);
        }
        let inv = (1.0 / sum) as f32;
        for o in or.iter_mut() {
            *o *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{poisoned, read, with};

    /// exp of a max-subtracted argument is a few ulps off; the GPU's normalizing sum is f32
    /// (per-invocation runs of up to ~200 terms, then a tree), ~1e-5 worst case on 49k-wide rows
    /// against the f64 reference sum: 5e-5 relative (measured up to ~1.5e-5 on lavapipe).
    const REL: f32 = 5e-5;

    #[test]
    fn gpu_soft_max_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("gpu_soft_max_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = SoftMax::new(&ctx).unwrap();
        for (n_rows, n, scale) in [
            (1, 49_152, 1.0),
            (9, 37, 0.125),
            (4, 1, 3.0),
            (3, 600, -2.0),
        ] {
            // large offsets check the max subtraction
            let x: Vec<f32> = (0..n_rows * n)
                .map(|_| rng.gen_range(-8.0..8.0) + 500.0)
                .collect();
            let xb = with(&ctx, "x", &x);
            let ob = poisoned(&ctx, "out", n_rows * n);
            let mut chain = Chain::new(&ctx).unwrap();
            let (r, c) = (n_rows as u32, n as u32);
            k.record(&mut chain, &xb.whole(), &ob.whole(), r, c, scale)
                .unwrap();
            // The in-place run overwrites what the first one reads: order them (the H100 runs
            // unordered dispatches concurrently; lavapipe happened not to).
            chain.barrier().unwrap();
            k.record(&mut chain, &xb.whole(), &xb.whole(), r, c, scale)
                .unwrap();
            chain.run().unwrap();
            let mut want = vec![0f32; n_rows * n];
            soft_max_ref(&x, &mut want, n, scale);
            for (what, b) in [("out", &ob), ("in place", &xb)] {
                if let Err(e) = check_close(&read(&ctx, b, n_rows * n), &want, REL) {
                    panic!("soft_max {what} {n_rows}x{n} scale {scale}, seed {seed}: {e}");
                }
            }
        }
    }

    #[test]
    fn short_output_is_a_shape_error() {
        let Some(ctx) = gpu_or_skip("soft_max_short_output") else {
            return;
        };
        let x = poisoned(&ctx, "x", 64);
        let o = poisoned(&ctx, "probs", 63);
        let k = SoftMax::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let err = k
            .record(&mut chain, &x.whole(), &o.whole(), 2, 32, 1.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("out") && err.contains("probs"), "{err}");
    }
}
