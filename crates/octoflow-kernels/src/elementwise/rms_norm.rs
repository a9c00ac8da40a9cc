//! RMSNorm per row (shader `rms_norm.comp`): `out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight`,
//! or added into `out` ([`RmsNorm::record_add`]: a post-norm and its residual add in one dispatch).

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need, overlap, same};
use crate::shaders;

/// The RMSNorm kernel, built once per device.
pub struct RmsNorm {
    pipeline: Pipeline,
    add: Pipeline,
}

impl RmsNorm {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(RmsNorm {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::RMS_NORM, 3, 12))?,
            add: Pipeline::new(ctx, &PipelineDesc::new(shaders::RMS_NORM_ADD, 4, 12))?,
        })
    }

    /// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, per row; x,out [n_rows, n] f32 (out may
    /// alias x); weight [n] f32. Rows may be tokens (n = n_embd) or token heads (n = head_dim).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        chain: &mut Chain,
        x: &BufferSlice,
        weight: &BufferSlice,
        out: &BufferSlice,
        n_rows: u32,
        n: u32,
        eps: f32,
    ) -> Result<()> {
        check("rms_norm", x, weight, out, n_rows, n)?;
        self.dispatch(chain, &self.pipeline, x, weight, out, n_rows, n, eps)
    }

    /// `out[r] += x[r] / sqrt(mean(x[r]^2) + eps) * weight` per row: a post-norm added into the
    /// residual stream in one dispatch. Shapes as [`RmsNorm::record`]; `out` must not alias `x`.
    #[allow(clippy::too_many_arguments)]
    pub fn record_add(
        &self,
        chain: &mut Chain,
        x: &BufferSlice,
        weight: &BufferSlice,
        out: &BufferSlice,
        n_rows: u32,
        n: u32,
        eps: f32,
    ) -> Result<()> {
        self.record_add_to(chain, x, weight, out, out, n_rows, n, eps)
    }

    /// `out[r] = res[r] + x[r] / sqrt(mean(x[r]^2) + eps) * weight` per row: a post-norm added
    /// to a residual stream that is read from `res` and written to `out` (`res` may be `out`;
    /// neither may alias `x`, nor `res` overlap `out` otherwise than exactly).
    #[allow(clippy::too_many_arguments)]
    pub fn record_add_to(
        &self,
        chain: &mut Chain,
        x: &BufferSlice,
        weight: &BufferSlice,
        res: &BufferSlice,
        out: &BufferSlice,
        n_rows: u32,
        n: u32,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "rms_norm_add";
        check(OP, x, weight, out, n_rows, n)?;
        need(OP, "res", res, u128::from(n_rows) * u128::from(n))?;
        if overlap(x, out) || overlap(x, res) {
            return Err(bad(OP, "out and res must not alias x".into()));
        }
        if overlap(res, out) && !same(res, out) {
            return Err(bad(OP, "res must be out or apart from it".into()));
        }
        let groups = chain.context().groups_1d(u64::from(n_rows), 1)?;
        chain.dispatch(
            &self.add,
            &[x.clone(), weight.clone(), out.clone(), res.clone()],
            &Push::new().u32(n_rows).u32(n).f32(eps),
            groups,
        )?;
        Self::cost(chain, n_rows, n, 3);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        chain: &mut Chain,
        pipeline: &Pipeline,
        x: &BufferSlice,
        weight: &BufferSlice,
        out: &BufferSlice,
        n_rows: u32,
        n: u32,
        eps: f32,
    ) -> Result<()> {
        let groups = chain.context().groups_1d(u64::from(n_rows), 1)?;
        chain.dispatch(
            pipeline,
            &[x.clone(), weight.clone(), out.clone()],
            &Push::new().u32(n_rows).u32(n).f32(eps),
            groups,
        )?;
        Self::cost(chain, n_rows, n, 2);
        Ok(())
    }

    /// The profile cost of a norm over `n_rows` x `n` that makes `passes` passes over the rows
    /// (x read, out written, the residual read by the add variant), the weight; ~4 flops per
    /// element.
    fn cost(chain: &mut Chain, n_rows: u32, n: u32, passes: u64) {
        let elems = u64::from(n_rows) * u64::from(n);
        chain.set_cost(4 * (passes * elems + u64::from(n)), 4 * elems);
    }
}

/// The shape and every operand's size (a shape error naming the operand).
fn check(
    op: &'static str,
    x: &BufferSlice,
    weight: &BufferSlice,
    out: &BufferSlice,
    n_rows: u32,
    n: u32,
) -> Result<()> {
    if n == 0 || n_rows == 0 {
        return Err(bad(op, format!("empty shape: {n_rows} rows of {n}")));
    }
    let total = u128::from(n_rows) * u128::from(n);
    need(op, "x", x, total)?;
    need(op, "out", out, total)?;
    need(op, "weight", weight, u128::from(n))?;
    Ok(())
}

/// CPU reference: RMSNorm of every `n`-wide row of `x` (`[rows, n]`) into `out`, the sum of
/// squares accumulated in f64.
pub fn rms_norm_ref(x: &[f32], weight: &[f32], out: &mut [f32], n: usize, eps: f32) {
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let scale = (1.0 / (ss / n as f64 + f64::from(eps)).sqrt()) as f32;
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * w;
        }
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::testkit::{poisoned, read, with};
    use crate::{check_close, check_close_sum};

    /// f32 sums of squares over up to 4096 values (relative error ~n * 2^-24 worst case, far less
    /// in practice with the tree reduction) and a 1/sqrt of a few ulps: 1e-5.
    const REL: f32 = 1e-5;

    #[test]
    fn gpu_rms_norm_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("gpu_rms_norm_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = RmsNorm::new(&ctx).unwrap();
        for (n_rows, n) in [
            (1, 4096),
            (7, 576),
            (37 * 9, 64),
            (3, 256),
            (5, 1),
            (2, 1000),
        ] {
            let x: Vec<f32> = (0..n_rows * n).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let w: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let eps = 1e-6;
            let (xb, wb) = (with(&ctx, "x", &x), with(&ctx, "w", &w));
            let ob = poisoned(&ctx, "out", n_rows * n);
            let mut chain = Chain::new(&ctx).unwrap();
            let (r, c) = (n_rows as u32, n as u32);
            k.record(&mut chain, &xb.whole(), &wb.whole(), &ob.whole(), r, c, eps)
                .unwrap();
            // in place on x as well, after the first run has read x
            chain.barrier().unwrap();
            k.record(&mut chain, &xb.whole(), &wb.whole(), &xb.whole(), r, c, eps)
                .unwrap();
            chain.run().unwrap();
            let mut want = vec![0f32; n_rows * n];
            rms_norm_ref(&x, &w, &mut want, n, eps);
            for (what, b) in [("out", &ob), ("in place", &xb)] {
                if let Err(e) = check_close(&read(&ctx, b, n_rows * n), &want, REL) {
                    panic!("rms_norm {what} {n_rows}x{n}, seed {seed}: {e}");
                }
            }
        }
    }

    /// The fused post-norm and residual add against the reference norm plus an add (f32 add:
    /// one more rounding, bounded against the addends: seed 8967051230209002494 gave -0.0462205
    /// for -0.0462198, 1.2e-5 of the result, 1e-7 of the addends); aliasing out and x is an error.
    #[test]
    fn gpu_rms_norm_add_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("gpu_rms_norm_add") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = RmsNorm::new(&ctx).unwrap();
        for (n_rows, n) in [(1, 640), (7, 576), (3, 1000), (2, 4096)] {
            let x: Vec<f32> = (0..n_rows * n).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let w: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let res: Vec<f32> = (0..n_rows * n).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let eps = 1e-6;
            let (xb, wb, rb) = (
                with(&ctx, "x", &x),
                with(&ctx, "w", &w),
                with(&ctx, "res", &res),
            );
            let mut chain = Chain::new(&ctx).unwrap();
            let (r, c) = (n_rows as u32, n as u32);
            k.record_add(&mut chain, &xb.whole(), &wb.whole(), &rb.whole(), r, c, eps)
                .unwrap();
            chain.run().unwrap();
            let mut normed = vec![0f32; n_rows * n];
            rms_norm_ref(&x, &w, &mut normed, n, eps);
            // the norm and the residual can nearly cancel: the add's rounding is relative to them
            let got = read(&ctx, &rb, n_rows * n);
            if let Err(e) = check_close_sum(&got, &normed, &res, REL) {
                panic!("rms_norm_add {n_rows}x{n}, seed {seed}: {e}");
            }
            // the residual read from one buffer, the sum written to another
            let (sb, ob) = (with(&ctx, "res", &res), poisoned(&ctx, "out", n_rows * n));
            let mut chain = Chain::new(&ctx).unwrap();
            k.record_add_to(
                &mut chain,
                &xb.whole(),
                &wb.whole(),
                &sb.whole(),
                &ob.whole(),
                r,
                c,
                eps,
            )
            .unwrap();
            chain.run().unwrap();
            let got = read(&ctx, &ob, n_rows * n);
            if let Err(e) = check_close_sum(&got, &normed, &res, REL) {
                panic!("rms_norm_add to another buffer {n_rows}x{n}, seed {seed}: {e}");
            }
            assert_eq!(read(&ctx, &sb, n_rows * n), res, "the residual was written");
            if n_rows > 1 {
                let part = sb.slice(0, 4 * n as u64).unwrap();
                let mut chain = Chain::new(&ctx).unwrap();
                let err = k.record_add_to(
                    &mut chain,
                    &xb.whole(),
                    &wb.whole(),
                    &sb.whole(),
                    &part,
                    1,
                    c,
                    eps,
                );
                assert!(err.is_err(), "a partly overlapping out accepted");
            }
            let mut chain = Chain::new(&ctx).unwrap();
            let err = k.record_add(&mut chain, &xb.whole(), &wb.whole(), &xb.whole(), r, c, eps);
            assert!(err.is_err(), "aliased out accepted");
        }
    }

    #[test]
    fn short_weight_is_a_shape_error() {
        let Some(ctx) = gpu_or_skip("rms_norm_short_weight") else {
            return;
        };
        let x = poisoned(&ctx, "x", 64);
        let w = poisoned(&ctx, "norm_w", 16);
        let k = RmsNorm::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let err = k
            .record(&mut chain, &x.whole(), &w.whole(), &x.whole(), 2, 32, 1e-5)
            .unwrap_err()
            .to_string();
        assert!(err.contains("weight") && err.contains("norm_w"), "{err}");
    }
}
