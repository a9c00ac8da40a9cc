//! Mixture-of-experts routing (shader `moe_route.comp`): per token, the `n_used` experts with
//! the largest router logits and their weights.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use super::MoeGating;
use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

const OP: &str = "moe_route";
/// Most experts the shader holds per token (`MAX_EXPERTS` in `moe_route.comp`).
pub const MAX_EXPERTS: u32 = 1024;
/// Most experts a token uses (`MAX_USED`).
pub const MAX_USED: u32 = 64;

/// The routing kernel, built once per device.
pub struct MoeRoute {
    pipeline: Pipeline,
}

impl MoeRoute {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(MoeRoute {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::MOE_ROUTE, 3, 20))?,
        })
    }

    /// Records, for each token `t < n_tokens` of `logits` (`[n_tokens, n_expert]` f32, the
    /// router's bias already added), the `n_used` largest logits' experts (ties to the lower
    /// expert) in `ids[t * n_used + j]` (u32) and their weights under `gating`, times `scale`,
    /// in `weights[t * n_used + j]` (f32), `j` in selection order: [`moe_route_ref`].
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        chain: &mut Chain,
        logits: &BufferSlice,
        ids: &BufferSlice,
        weights: &BufferSlice,
        n_tokens: u32,
        n_expert: u32,
        n_used: u32,
        gating: MoeGating,
        scale: f32,
    ) -> Result<()> {
        if n_tokens == 0 || n_used == 0 || n_used > n_expert {
            return Err(bad(
                OP,
                format!("{n_tokens} tokens, {n_used} of {n_expert} experts: need tokens and 1..=n_expert experts per token"),
            ));
        }
        if n_expert > MAX_EXPERTS || n_used > MAX_USED {
            return Err(bad(
                OP,
                format!("{n_used} of {n_expert} experts: the kernel takes at most {MAX_USED} of {MAX_EXPERTS}"),
            ));
        }
        let pairs = u128::from(n_tokens) * u128::from(n_used);
        need(
            OP,
            "logits",
            logits,
            u128::from(n_tokens) * u128::from(n_expert),
        )?;
        need(OP, "ids", ids, pairs)?;
        need(OP, "weights", weights, pairs)?;
        let groups = chain.context().groups_1d(u64::from(n_tokens), 1)?;
        let push = Push::new()
            .u32(n_tokens)
            .u32(n_expert)
            .u32(n_used)
            .u32(gating.code())
            .f32(scale);
        chain.dispatch(
            &self.pipeline,
            &[logits.clone(), ids.clone(), weights.clone()],
            &push,
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: per token of `logits` (`[n_tokens, n_expert]`), the `n_used` experts of the
/// largest logits (ties to the lower expert) and their weights (f64 softmax per `gating`, times
/// `scale`), as `(ids, weights)`, each `[n_tokens * n_used]`.
pub fn moe_route_ref(
    logits: &[f32],
    n_expert: usize,
    n_used: usize,
    gating: MoeGating,
    scale: f32,
) -> (Vec<u32>, Vec<f32>) {
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for lg in logits.chunks_exact(n_expert) {
        let mut order: Vec<usize> = (0..n_expert).collect();
        order.sort_by(|&a, &b| lg[b].total_cmp(&lg[a]).then(a.cmp(&b)));
        order.truncate(n_used);
        let m = f64::from(lg[order[0]]);
        let e = |i: usize| (f64::from(lg[i]) - m).exp();
        let sum: f64 = match gating {
            MoeGating::SoftmaxOfSelected => order.iter().map(|&i| e(i)).sum(),
            MoeGating::Softmax { .. } => (0..n_expert).map(e).sum(),
        };
        let mut w: Vec<f64> = order.iter().map(|&i| e(i) / sum).collect();
        if gating == (MoeGating::Softmax { norm: true }) {
            let s = w.iter().sum::<f64>().max(6.103_515_625e-5);
            w.iter_mut().for_each(|v| *v /= s);
        }
        ids.extend(order.iter().map(|&i| i as u32));
        weights.extend(w.iter().map(|&v| (v * f64::from(scale)) as f32));
    }
    (ids, weights)
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{poisoned, read, seeded, with};

    /// exp on the GPU is a few ulps off, and the sums run in another order: 1e-5.
    const REL: f32 = 1e-5;

    #[test]
    fn gpu_routing_matches_the_reference_for_every_gating() {
        let Some(ctx) = gpu_or_skip("gpu_moe_route") else {
            return;
        };
        let (seed, mut rng) = seeded(module_path!());
        let k = MoeRoute::new(&ctx).unwrap();
        let gatings = [
            MoeGating::SoftmaxOfSelected,
            MoeGating::Softmax { norm: false },
            MoeGating::Softmax { norm: true },
        ];
        for (n_expert, n_used, n_tokens) in [
            (4usize, 2usize, 7usize),
            (32, 4, 5),
            (128, 8, 33),
            (100, 1, 3),
            (300, 64, 2),
        ] {
            for gating in gatings {
                // logits on a coarse grid, so that ties between experts are common
                let logits: Vec<f32> = (0..n_tokens * n_expert)
                    .map(|_| f32::from(rng.gen_range(-40i8..40)) / 8.0)
                    .collect();
                let scale = rng.gen_range(0.5..2.5);
                let lb = with(&ctx, "logits", &logits);
                let pairs = n_tokens * n_used;
                let ib = poisoned(&ctx, "ids", pairs);
                let wb = poisoned(&ctx, "weights", pairs);
                let mut chain = Chain::new(&ctx).unwrap();
                k.record(
                    &mut chain,
                    &lb.whole(),
                    &ib.whole(),
                    &wb.whole(),
                    n_tokens as u32,
                    n_expert as u32,
                    n_used as u32,
                    gating,
                    scale,
                )
                .unwrap();
                chain.run().unwrap();
                let (want_ids, want_w) = moe_route_ref(&logits, n_expert, n_used, gating, scale);
                let mut got_ids = vec![0u32; pairs];
                ctx.download(&ib, 0, &mut got_ids).unwrap();
                let what = format!("{n_used} of {n_expert}, {gating:?}, seed {seed}");
                assert_eq!(got_ids, want_ids, "ids: {what}");
                if let Err(e) = check_close(&read(&ctx, &wb, pairs), &want_w, REL) {
                    panic!("weights: {what}: {e}");
                }
            }
        }
    }

    #[test]
    fn ties_go_to_the_lower_expert() {
        let (ids, w) = moe_route_ref(
            &[1.0, 3.0, 3.0, 1.0, 3.0],
            5,
            3,
            MoeGating::SoftmaxOfSelected,
            1.0,
        );
        assert_eq!(ids, [1, 2, 4]);
        assert!(w.iter().all(|&v| (v - 1.0 / 3.0).abs() < 1e-6), "{w:?}");
    }

    #[test]
    fn more_experts_per_token_than_experts_is_a_shape_error() {
        let Some(ctx) = gpu_or_skip("moe_route_bad") else {
            return;
        };
        let b = poisoned(&ctx, "b", 64);
        let k = MoeRoute::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let e = k
            .record(
                &mut chain,
                &b.whole(),
                &b.whole(),
                &b.whole(),
                1,
                4,
                5,
                MoeGating::SoftmaxOfSelected,
                1.0,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("moe_route") && e.contains("5 of 4"), "{e}");
    }
}
