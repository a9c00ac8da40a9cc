//! Grouping a batch's (token, slot) pairs by expert (shader `moe_group.comp`), for the grouped
//! expert products.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use super::MAX_EXPERTS;
use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

const OP: &str = "moe_group";

/// The grouping kernel, built once per device (one workgroup per dispatch).
pub struct MoeGroup {
    pipeline: Pipeline,
}

impl MoeGroup {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(MoeGroup {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::MOE_GROUP, 3, 8))?,
        })
    }

    /// Records the grouping of `n_pairs` pairs whose experts are `ids` (`[n_pairs]` u32, each
    /// below `n_expert`): `offsets` (`[n_expert + 1]` u32) gets each expert's first position in
    /// `list` and `n_pairs` last, `list` (`[n_pairs]` u32) the pairs sorted by expert, then by
    /// index: [`moe_group_ref`].
    pub fn record(
        &self,
        chain: &mut Chain,
        ids: &BufferSlice,
        offsets: &BufferSlice,
        list: &BufferSlice,
        n_pairs: u32,
        n_expert: u32,
    ) -> Result<()> {
        if n_pairs == 0 || n_expert == 0 || n_expert > MAX_EXPERTS {
            return Err(bad(
                OP,
                format!("{n_pairs} pairs of {n_expert} experts: need pairs and 1..={MAX_EXPERTS} experts"),
            ));
        }
        need(OP, "ids", ids, u128::from(n_pairs))?;
        need(OP, "offsets", offsets, u128::from(n_expert) + 1)?;
        need(OP, "list", list, u128::from(n_pairs))?;
        chain.dispatch(
            &self.pipeline,
            &[ids.clone(), offsets.clone(), list.clone()],
            &Push::new().u32(n_pairs).u32(n_expert),
            [1, 1, 1],
        )?;
        Ok(())
    }
}

/// CPU reference: `(offsets, list)` of the pairs whose experts are `ids` (see
/// [`MoeGroup::record`]).
pub fn moe_group_ref(ids: &[u32], n_expert: usize) -> (Vec<u32>, Vec<u32>) {
    let mut offsets = vec![0u32; n_expert + 1];
    for &e in ids {
        offsets[e as usize + 1] += 1;
    }
    for e in 0..n_expert {
        offsets[e + 1] += offsets[e];
    }
    let mut list: Vec<u32> = (0..ids.len() as u32).collect();
    list.sort_by_key(|&p| (ids[p as usize], p));
    (offsets, list)
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::seq::SliceRandom;
    use rand::Rng;

    use super::*;
    use crate::testkit::{seeded, with};

    #[test]
    fn gpu_grouping_matches_the_reference() {
        let Some(ctx) = gpu_or_skip("gpu_moe_group") else {
            return;
        };
        let (seed, mut rng) = seeded(module_path!());
        let k = MoeGroup::new(&ctx).unwrap();
        // one expert (256 segments) to more experts than invocations (one segment each)
        for (n_tokens, n_used, n_expert) in [
            (1usize, 1usize, 1usize),
            (7, 2, 4),
            (512, 8, 128),
            (300, 4, 32),
            (40, 3, 700),
        ] {
            // each token picks distinct experts, as the router does
            let mut ids = Vec::with_capacity(n_tokens * n_used);
            let mut all: Vec<u32> = (0..n_expert as u32).collect();
            for _ in 0..n_tokens {
                // a skewed choice: some experts get most tokens, some none
                let hot = rng.gen_range(0..n_expert.max(1)).min(n_expert - n_used);
                all[hot..].shuffle(&mut rng);
                ids.extend_from_slice(&all[hot..hot + n_used]);
            }
            let n_pairs = ids.len();
            let ib = with(&ctx, "ids", &ids);
            let ob = with(&ctx, "offsets", &vec![u32::MAX; n_expert + 1]);
            let lb = with(&ctx, "list", &vec![u32::MAX; n_pairs]);
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(
                &mut chain,
                &ib.whole(),
                &ob.whole(),
                &lb.whole(),
                n_pairs as u32,
                n_expert as u32,
            )
            .unwrap();
            chain.run().unwrap();
            let (want_off, want_list) = moe_group_ref(&ids, n_expert);
            let mut off = vec![0u32; n_expert + 1];
            let mut list = vec![0u32; n_pairs];
            ctx.download(&ob, 0, &mut off).unwrap();
            ctx.download(&lb, 0, &mut list).unwrap();
            let what = format!("{n_tokens} x {n_used} of {n_expert}, seed {seed}");
            assert_eq!(off, want_off, "offsets: {what}");
            assert_eq!(list, want_list, "list: {what}");
        }
    }

    #[test]
    fn the_reference_is_a_stable_sort_by_expert() {
        let (off, list) = moe_group_ref(&[2, 0, 2, 1, 0], 4);
        assert_eq!(off, [0, 2, 3, 5, 5]);
        assert_eq!(list, [1, 4, 3, 0, 2]);
    }
}
