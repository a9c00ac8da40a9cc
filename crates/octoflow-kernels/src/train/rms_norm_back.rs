//! RMSNorm backward per row (shader `rms_norm_back.comp`): the gradient w.r.t. the input of
//! `y = x / sqrt(mean(x^2) + eps) * weight` (the weight is frozen: no weight gradient).

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

/// The RMSNorm backward kernel, built once per device.
pub struct RmsNormBack {
    pipeline: Pipeline,
}

impl RmsNormBack {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(RmsNormBack {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::RMS_NORM_BACK, 4, 16))?,
        })
    }

    /// y = x / sqrt(mean(x²) + eps) * weight per n-wide row; given dy, writes (or adds,
    /// `accumulate`) dx = ∂(Σ dy·y)/∂x. x, dy, dx `[n_rows, n]` f32, weight `[n]` f32; dx may
    /// alias dy when `!accumulate`. One workgroup per row.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        chain: &mut Chain,
        x: &BufferSlice,
        weight: &BufferSlice,
        dy: &BufferSlice,
        dx: &BufferSlice,
        n_rows: u32,
        n: u32,
        eps: f32,
        accumulate: bool,
    ) -> Result<()> {
        const OP: &str = "rms_norm_back";
        if n == 0 || n_rows == 0 {
            return Err(bad(OP, format!("empty shape: {n_rows} rows of {n}")));
        }
        let total = u128::from(n_rows) * u128::from(n);
        if total > u128::from(u32::MAX) {
            return Err(bad(OP, format!("{total} elements exceed u32 indexing")));
        }
        need(OP, "x", x, total)?;
        need(OP, "weight", weight, u128::from(n))?;
        need(OP, "dy", dy, total)?;
        need(OP, "dx", dx, total)?;
        let groups = chain.context().groups_1d(u64::from(n_rows), 1)?;
        chain.dispatch(
            &self.pipeline,
            &[x.clone(), weight.clone(), dy.clone(), dx.clone()],
            &Push::new()
                .u32(n_rows)
                .u32(n)
                .f32(eps)
                .u32(u32::from(accumulate)),
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference (f64 inside): for every `n`-wide row of `x`, `dy`, `dx` (`[rows, n]`), with
/// `s = 1/sqrt(mean(x^2) + eps)` and `y_k = x_k s w_k`,
/// `dx_k = ∂(Σ_i dy_i y_i)/∂x_k = s w_k dy_k - x_k s^3 / n Σ_i w_i dy_i x_i`,
/// written into `dx`, or added to it when `accumulate`.
pub fn rms_norm_back_ref(
    x: &[f32],
    weight: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    n: usize,
    eps: f32,
    accumulate: bool,
) {
    let rows = x.chunks_exact(n).zip(dy.chunks_exact(n));
    for ((xr, dyr), dxr) in rows.zip(dx.chunks_exact_mut(n)) {
        let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let s = 1.0 / (ss / n as f64 + f64::from(eps)).sqrt();
        let d: f64 = (0..n)
            .map(|i| f64::from(weight[i]) * f64::from(dyr[i]) * f64::from(xr[i]))
            .sum();
        for k in 0..n {
            let g = s * f64::from(weight[k]) * f64::from(dyr[k])
                - f64::from(xr[k]) * s * s * s * d / n as f64;
            let prev = if accumulate { f64::from(dxr[k]) } else { 0.0 };
            dxr[k] = (prev + g) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::grad_check::{central_difference, dot};
    use crate::rms_norm_ref;
    use crate::testkit::{poisoned, read, with};

    /// f32 sums over up to 4096 terms and a 1/sqrt of a few ulps, then `s (w dy - x c)`, whose
    /// two terms can cancel: the absolute error is ~1e-7 of |s w dy|, i.e. ~1e-5 of check_close's
    /// 1% floor (measured up to 6e-6 on lavapipe). Rows of n = 1 are ill-conditioned at tiny
    /// eps (the gradient is eps / (x^2 + eps) of its terms), so that case uses eps = 0.5.
    const REL: f32 = 5e-5;

    #[test]
    fn gpu_rms_norm_back_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("gpu_rms_norm_back_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = RmsNormBack::new(&ctx).unwrap();
        for (n_rows, n) in [
            (1, 4096),
            (7, 576),
            (37 * 9, 64),
            (5, 1),
            (2, 1000),
            (3, 257),
        ] {
            let len = n_rows * n;
            let x: Vec<f32> = (0..len).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let w: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let dy: Vec<f32> = (0..len).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let prior: Vec<f32> = (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let eps = if n == 1 { 0.5 } else { 1e-6 };
            let (xb, wb) = (with(&ctx, "x", &x), with(&ctx, "w", &w));
            let dyb = with(&ctx, "dy", &dy);
            let outb = poisoned(&ctx, "dx", len);
            let accb = with(&ctx, "dx_acc", &prior);
            let alias = with(&ctx, "dy_alias", &dy);
            let mut chain = Chain::new(&ctx).unwrap();
            let (r, c) = (n_rows as u32, n as u32);
            let (xs, ws, dys) = (xb.whole(), wb.whole(), dyb.whole());
            k.record(&mut chain, &xs, &ws, &dys, &outb.whole(), r, c, eps, false)
                .unwrap();
            k.record(&mut chain, &xs, &ws, &dys, &accb.whole(), r, c, eps, true)
                .unwrap();
            let a = alias.whole();
            k.record(&mut chain, &xs, &ws, &a, &a, r, c, eps, false)
                .unwrap();
            chain.run().unwrap();
            let mut want = vec![f32::NAN; len];
            rms_norm_back_ref(&x, &w, &dy, &mut want, n, eps, false);
            let mut want_acc = prior.clone();
            rms_norm_back_ref(&x, &w, &dy, &mut want_acc, n, eps, true);
            for (what, b, want) in [
                ("write", &outb, &want),
                ("accumulate", &accb, &want_acc),
                ("dx = dy", &alias, &want),
            ] {
                if let Err(e) = check_close(&read(&ctx, b, len), want, REL) {
                    panic!("rms_norm_back {what} {n_rows}x{n}, seed {seed}: {e}");
                }
            }
        }
    }

    #[test]
    fn back_reference_is_the_gradient_of_the_forward_reference() {
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        for (n_rows, n, eps) in [(3usize, 6usize, 1e-5f32), (2, 1, 0.3), (1, 13, 0.1)] {
            let x: Vec<f32> = (0..n_rows * n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let w: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let dy: Vec<f32> = (0..n_rows * n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let loss = |x: &[f32]| {
                let mut y = vec![0f32; x.len()];
                rms_norm_ref(x, &w, &mut y, n, eps);
                dot(&y, &dy)
            };
            let fd = central_difference(&x, 4e-2, loss);
            let mut grad = vec![0f32; x.len()];
            rms_norm_back_ref(&x, &w, &dy, &mut grad, n, eps, false);
            // f32 rounding of the row's y (~1e-7 of a loss of ~n) over steps of ±2e-2 and ±4e-2
            // (Richardson-combined: no h^2 term) is ~1e-5 absolute, up to ~1e-3 of check_close's
            // 1% floor (measured 7e-4): 3e-3. A wrong derivative is off by O(1).
            if let Err(e) = check_close(&grad, &fd, 3e-3) {
                panic!("rms_norm_back_ref vs finite differences, {n_rows}x{n}, seed {seed}: {e}");
            }
        }
    }

    #[test]
    fn short_operands_are_shape_errors() {
        let Some(ctx) = gpu_or_skip("rms_norm_back_shape_errors") else {
            return;
        };
        let x = poisoned(&ctx, "x", 64);
        let w = poisoned(&ctx, "norm_w", 16);
        let dy = poisoned(&ctx, "grad_y", 63);
        let k = RmsNormBack::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let (xs, ws, dys) = (x.whole(), w.whole(), dy.whole());
        let err = k
            .record(&mut chain, &xs, &ws, &xs, &xs, 2, 32, 1e-5, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("weight") && err.contains("norm_w"), "{err}");
        let err = k
            .record(&mut chain, &xs, &xs, &dys, &xs, 2, 32, 1e-5, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("dy") && err.contains("grad_y"), "{err}");
        let err = k
            .record(&mut chain, &xs, &xs, &xs, &xs, 0, 32, 1e-5, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty"), "{err}");
    }
}
