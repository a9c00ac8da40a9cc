//! Token ids of a batched step (shader `pick_ids.comp`): each row's id is either given by the
//! host or taken from what the previous step sampled on the device, so a step can be submitted
//! before the previous one's tokens have been read back.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

/// Invocations per workgroup (`local_size_x` in `pick_ids.comp`).
const LOCAL_SIZE: u32 = 256;

/// The top bit of a source word: "the token at index `word & !FROM_PREV` of `prev`".
pub const FROM_PREV: u32 = 0x8000_0000;

/// The id-picking kernel, built once per device.
pub struct PickIds {
    pipeline: Pipeline,
}

impl PickIds {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(PickIds {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::PICK_IDS, 3, 8))?,
        })
    }

    /// Records `out[r] = pick_ids_ref(src, prev)[r]` for `r < n`. `src`: `[n]` u32 (an id, or
    /// [`FROM_PREV`] | index into `prev`); `prev`: `[n_prev]` u32; `out`: `[n]` u32.
    pub fn record(
        &self,
        chain: &mut Chain,
        src: &BufferSlice,
        prev: &BufferSlice,
        n_prev: u32,
        out: &BufferSlice,
        n: u32,
    ) -> Result<()> {
        const OP: &str = "pick_ids";
        if n == 0 {
            return Err(bad(OP, "no rows".into()));
        }
        need(OP, "src", src, u128::from(n))?;
        need(OP, "prev", prev, u128::from(n_prev))?;
        need(OP, "out", out, u128::from(n))?;
        let groups = chain.context().groups_1d(u64::from(n), LOCAL_SIZE)?;
        chain.dispatch(
            &self.pipeline,
            &[src.clone(), prev.clone(), out.clone()],
            &Push::new().u32(n).u32(n_prev),
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: each word of `src` is an id, or (top bit set) an index into `prev` whose
/// token it takes; an index past `prev` gives 0.
pub fn pick_ids_ref(src: &[u32], prev: &[u32]) -> Vec<u32> {
    src.iter()
        .map(|&s| {
            if s & FROM_PREV == 0 {
                s
            } else {
                prev.get((s & !FROM_PREV) as usize).copied().unwrap_or(0)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::testkit::with;

    #[test]
    fn gpu_pick_ids_matches_the_reference() {
        let Some(ctx) = gpu_or_skip("gpu_pick_ids") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = PickIds::new(&ctx).unwrap();
        for (n, n_prev) in [(1usize, 1usize), (300, 129), (7, 3)] {
            let prev: Vec<u32> = (0..n_prev).map(|_| rng.gen_range(0..200_000)).collect();
            let src: Vec<u32> = (0..n)
                .map(|_| match rng.gen_range(0..3) {
                    0 => rng.gen_range(0..200_000),
                    1 => FROM_PREV | rng.gen_range(0..n_prev as u32),
                    _ => FROM_PREV | rng.gen_range(0..2 * n_prev as u32 + 1),
                })
                .collect();
            let (sb, pb) = (with(&ctx, "src", &src), with(&ctx, "prev", &prev));
            let ob = with(&ctx, "out", &vec![u32::MAX; n]);
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(
                &mut chain,
                &sb.whole(),
                &pb.whole(),
                n_prev as u32,
                &ob.whole(),
                n as u32,
            )
            .unwrap();
            chain.run().unwrap();
            let mut got = vec![0u32; n];
            ctx.download(&ob, 0, &mut got).unwrap();
            assert_eq!(got, pick_ids_ref(&src, &prev), "{n} rows, seed {seed}");
        }
    }

    #[test]
    fn short_buffers_are_shape_errors() {
        let Some(ctx) = gpu_or_skip("pick_ids_shapes") else {
            return;
        };
        let k = PickIds::new(&ctx).unwrap();
        let b = with(&ctx, "ids", &[0u32; 4]);
        let mut chain = Chain::new(&ctx).unwrap();
        let err = k
            .record(&mut chain, &b.whole(), &b.whole(), 4, &b.whole(), 5)
            .unwrap_err()
            .to_string();
        assert!(err.contains("src") && err.contains("ids"), "{err}");
    }
}
