//! The weighted sum of each token's expert outputs, added to the residual stream (shader
//! `moe_combine.comp`).

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

const OP: &str = "moe_combine";
/// Invocations per workgroup (`local_size_x` in `moe_combine.comp`).
const LOCAL_SIZE: u32 = 256;

/// The combining kernel, built once per device.
pub struct MoeCombine {
    pipeline: Pipeline,
}

impl MoeCombine {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(MoeCombine {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::MOE_COMBINE, 3, 12))?,
        })
    }

    /// Records `x[t] += Σ_j weights[t * n_used + j] · y[t * n_used + j]` (j in increasing
    /// order) for `t < n_tokens`: `y` `[n_tokens * n_used, n_embd]`, `weights`
    /// `[n_tokens * n_used]`, `x` `[n_tokens, n_embd]`, all f32; `x` apart from the others.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        chain: &mut Chain,
        y: &BufferSlice,
        weights: &BufferSlice,
        x: &BufferSlice,
        n_tokens: u32,
        n_used: u32,
        n_embd: u32,
    ) -> Result<()> {
        let n = u64::from(n_tokens) * u64::from(n_embd);
        if n == 0 || n_used == 0 || n > u64::from(u32::MAX) {
            return Err(bad(
                OP,
                format!("{n_tokens} tokens of {n_embd} with {n_used} experts each"),
            ));
        }
        let pairs = u128::from(n_tokens) * u128::from(n_used);
        need(OP, "y", y, pairs * u128::from(n_embd))?;
        need(OP, "weights", weights, pairs)?;
        need(OP, "x", x, u128::from(n))?;
        let groups = chain.context().groups_1d(n, LOCAL_SIZE)?;
        chain.dispatch(
            &self.pipeline,
            &[y.clone(), weights.clone(), x.clone()],
            &Push::new().u32(n_tokens).u32(n_used).u32(n_embd),
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference of [`MoeCombine::record`].
pub fn moe_combine_ref(y: &[f32], weights: &[f32], x: &mut [f32], n_used: usize) {
    let n_embd = y.len() / weights.len();
    for (t, xt) in x.chunks_exact_mut(n_embd).enumerate() {
        for (d, v) in xt.iter_mut().enumerate() {
            let mut s = 0f32;
            for j in 0..n_used {
                let p = t * n_used + j;
                s += weights[p] * y[p * n_embd + d];
            }
            *v += s;
        }
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;

    use super::*;
    use crate::check_close_sum;
    use crate::testkit::{random, read, seeded, with};

    #[test]
    fn gpu_combine_matches_the_reference() {
        let Some(ctx) = gpu_or_skip("gpu_moe_combine") else {
            return;
        };
        let (seed, mut rng) = seeded(module_path!());
        let k = MoeCombine::new(&ctx).unwrap();
        for (n_tokens, n_used, n_embd) in [(1usize, 1usize, 7usize), (5, 2, 32), (33, 8, 200)] {
            let pairs = n_tokens * n_used;
            let y = random(&mut rng, pairs * n_embd);
            let w = random(&mut rng, pairs);
            let x = random(&mut rng, n_tokens * n_embd);
            let (yb, wb, xb) = (
                with(&ctx, "y", &y),
                with(&ctx, "w", &w),
                with(&ctx, "x", &x),
            );
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(
                &mut chain,
                &yb.whole(),
                &wb.whole(),
                &xb.whole(),
                n_tokens as u32,
                n_used as u32,
                n_embd as u32,
            )
            .unwrap();
            chain.run().unwrap();
            let mut sum = vec![0f32; n_tokens * n_embd];
            moe_combine_ref(&y, &w, &mut sum, n_used);
            let got = read(&ctx, &xb, n_tokens * n_embd);
            // the same sums in the same order: the residual plus them, within rounding
            if let Err(e) = check_close_sum(&got, &x, &sum, 1e-5) {
                panic!("{n_tokens} x {n_used} x {n_embd}, seed {seed}: {e}");
            }
        }
    }
}
