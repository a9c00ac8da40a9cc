//! Which row bucket a VM step's forward runs at (shader `vm_select.comp`): `GpuRun` records the
//! batched forward once per bucket of rows, each in a gated span, and this writes the skip
//! flags the gate kernel turns into those spans' indirect arguments — the smallest bucket that
//! holds the step's rows runs, the others (and all of them when the step has no rows) issue
//! only empty dispatches.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use super::layout::P_ROWS;
use crate::error::{KernelError, Result};
use crate::operand::need;
use crate::shaders;

/// Most buckets one selection covers (the shader's push-constant array).
pub const MAX_BUCKETS: usize = 8;

/// The selection dispatch, built once per device.
pub struct VmSelect {
    pipeline: Pipeline,
}

impl VmSelect {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        let push = 4 * (1 + MAX_BUCKETS as u32);
        Ok(VmSelect {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::VM_SELECT, 2, push))?,
        })
    }

    /// Records `skip[j] = rows ∈ (bounds[j-1], bounds[j]] ? 0 : 1` for every bucket, `rows`
    /// being the step record's row count (`step[P_ROWS]`). `bounds` must increase strictly
    /// and hold 1 to [`MAX_BUCKETS`] counts.
    pub fn record(
        &self,
        chain: &mut Chain,
        step: &BufferSlice,
        bounds: &[u32],
        skip: &BufferSlice,
    ) -> Result<()> {
        const OP: &str = "vm_select";
        check_bounds(bounds)?;
        need(OP, "step", step, u128::from(P_ROWS) + 1)?;
        need(OP, "skip", skip, bounds.len() as u128)?;
        let mut push = Push::new().u32(bounds.len() as u32);
        for j in 0..MAX_BUCKETS {
            push = push.u32(bounds.get(j).copied().unwrap_or(u32::MAX));
        }
        chain.dispatch(
            &self.pipeline,
            &[step.clone(), skip.clone()],
            &push,
            [1, 1, 1],
        )?;
        Ok(())
    }
}

fn check_bounds(bounds: &[u32]) -> Result<()> {
    let increasing = bounds.windows(2).all(|w| w[0] < w[1]);
    if bounds.is_empty() || bounds.len() > MAX_BUCKETS || !increasing || bounds[0] == 0 {
        return Err(KernelError::Shape {
            op: "vm_select",
            detail: format!(
                "bucket bounds {bounds:?}: 1 to {MAX_BUCKETS} positive counts, increasing"
            ),
        });
    }
    Ok(())
}

/// CPU reference of [`VmSelect::record`] for a step of `rows` rows.
pub fn vm_select_ref(rows: u32, bounds: &[u32]) -> Vec<u32> {
    let mut lower = 0;
    bounds
        .iter()
        .map(|&b| {
            let mine = rows > lower && rows <= b;
            lower = b;
            u32::from(!mine)
        })
        .collect()
}

/// Bucket bounds for a forward of at most `max_rows` rows: one bucket, the maximum. A skipped
/// bucket's span still issues its dispatches and barriers each step (as no-ops), and on the
/// H100 those cost more than the rows a smaller bucket saves (docs/PERFORMANCE.md, "NVIDIA H100: agent runs"), so
/// the policy keeps only the span that skips steps with no rows at all. The selection and
/// `GpuRun` take any increasing list: a cheaper skip (one recording whose row count is read
/// on the GPU) would make more buckets worth their cost.
pub fn row_buckets(max_rows: u32) -> Vec<u32> {
    vec![max_rows.max(1)]
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use octoflow_vk::{Buffer, MemoryKind};
    use rand::Rng;

    use super::*;

    #[test]
    fn buckets_end_at_the_maximum_and_are_valid_bounds() {
        for max in [1u32, 3, 4, 7, 8, 9, 48, 288, 1032, 65536, u32::MAX] {
            let b = row_buckets(max);
            assert_eq!(*b.last().unwrap(), max, "{max}: {b:?}");
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{max}: {b:?}");
            assert!(b.len() <= MAX_BUCKETS, "{max}: {b:?}");
            check_bounds(&b).unwrap();
        }
        assert_eq!(row_buckets(288), vec![288]);
    }

    #[test]
    fn the_reference_selects_the_smallest_bucket_that_holds_the_rows() {
        let b = [4, 16, 64, 288];
        assert_eq!(vm_select_ref(0, &b), vec![1, 1, 1, 1]);
        assert_eq!(vm_select_ref(1, &b), vec![0, 1, 1, 1]);
        assert_eq!(vm_select_ref(4, &b), vec![0, 1, 1, 1]);
        assert_eq!(vm_select_ref(5, &b), vec![1, 0, 1, 1]);
        assert_eq!(vm_select_ref(288, &b), vec![1, 1, 1, 0]);
    }

    #[test]
    fn vm_select_matches_the_reference_on_random_steps() {
        let Some(ctx) = gpu_or_skip("vm_select_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let select = VmSelect::new(&ctx).unwrap();
        for _ in 0..6 {
            let max = rng.gen_range(1..5000u32);
            let bounds = row_buckets(max);
            let rows = if rng.gen_bool(0.2) {
                0
            } else {
                rng.gen_range(1..=max)
            };
            let step = Buffer::new(&ctx, "step", 16, MemoryKind::Upload).unwrap();
            let words = [rows, rng.gen(), rng.gen(), rng.gen()];
            step.write(0, &words).unwrap();
            let skip = Buffer::new(&ctx, "skip", 4 * 8, MemoryKind::DeviceLocal).unwrap();
            ctx.fill(&skip, 0, skip.size(), 0xDEAD_BEEF).unwrap();
            let mut chain = Chain::new(&ctx).unwrap();
            select
                .record(&mut chain, &step.whole(), &bounds, &skip.whole())
                .unwrap();
            chain.run().unwrap();
            let mut got = vec![0u32; bounds.len()];
            ctx.download(&skip, 0, &mut got).unwrap();
            assert_eq!(
                got,
                vm_select_ref(rows, &bounds),
                "seed {seed}, rows {rows}, bounds {bounds:?}"
            );
        }
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn bad_bounds_are_a_shape_error() {
        let Some(ctx) = gpu_or_skip("vm_select_bad_bounds") else {
            return;
        };
        let select = VmSelect::new(&ctx).unwrap();
        let b = Buffer::new(&ctx, "step", 64, MemoryKind::Upload).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        for bad in [&[][..], &[4, 4], &[0, 4], &[1, 2, 3, 4, 5, 6, 7, 8, 9]] {
            let err = select
                .record(&mut chain, &b.whole(), bad, &b.whole())
                .unwrap_err();
            assert!(err.to_string().contains("bucket bounds"), "{err}");
        }
    }
}
