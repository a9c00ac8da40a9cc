//! Residual add: `out[i] = a[i] + b[i]`, f32, `n` elements (shader `add.comp`).

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::{KernelError, Result};
use crate::shaders;

/// Invocations per workgroup (`local_size_x` in `add.comp`).
const LOCAL_SIZE: u32 = 256;

/// The residual-add kernel, built once per device.
pub struct Add {
    pipeline: Pipeline,
}

impl Add {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Add {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::ADD, 3, 4))?,
        })
    }

    /// Records `out = a + b` over `n` f32 elements. `out` may alias `a` or `b` (in-place
    /// residual). Each slice must hold at least `n` floats.
    pub fn record(
        &self,
        chain: &mut Chain,
        a: &BufferSlice,
        b: &BufferSlice,
        out: &BufferSlice,
        n: u32,
    ) -> Result<()> {
        for (name, s) in [("a", a), ("b", b), ("out", out)] {
            if s.size < 4 * u64::from(n) {
                let detail = format!(
                    "{name} ({}) holds {} bytes, {n} floats need {}",
                    s.buffer.name(),
                    s.size,
                    4 * u64::from(n)
                );
                return Err(KernelError::Shape { op: "add", detail });
            }
        }
        let groups = chain.context().groups_1d(u64::from(n), LOCAL_SIZE)?;
        chain.dispatch(
            &self.pipeline,
            &[a.clone(), b.clone(), out.clone()],
            &Push::new().u32(n),
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: `out[i] = a[i] + b[i]`.
pub fn add_ref(a: &[f32], b: &[f32], out: &mut [f32]) {
    debug_assert!(a.len() == b.len() && b.len() == out.len());
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use octoflow_vk::{Buffer, MemoryKind};
    use rand::Rng;

    use super::*;
    use crate::check_close;

    /// f32 addition is correctly rounded on every Vulkan device, so the bound is one ulp-ish.
    const REL: f32 = 1e-6;

    #[test]
    fn gpu_add_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("gpu_add_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let n = rng.gen_range(1..200_000u32);
        let a: Vec<f32> = (0..n).map(|_| rng.gen_range(-10.0..10.0)).collect();
        let b: Vec<f32> = (0..n).map(|_| rng.gen_range(-10.0..10.0)).collect();
        let bytes = 4 * u64::from(n);
        let buf = |name| Buffer::new(&ctx, name, bytes, MemoryKind::DeviceLocal).unwrap();
        let (ab, bb, ob) = (buf("a"), buf("b"), buf("out"));
        ctx.upload(&ab, 0, &a).unwrap();
        ctx.upload(&bb, 0, &b).unwrap();
        ctx.fill(&ob, 0, bytes, f32::NAN.to_bits()).unwrap();

        let add = Add::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        add.record(&mut chain, &ab.whole(), &bb.whole(), &ob.whole(), n)
            .unwrap();
        chain.run().unwrap();

        let mut got = vec![0f32; n as usize];
        ctx.download(&ob, 0, &mut got).unwrap();
        let mut want = vec![0f32; n as usize];
        add_ref(&a, &b, &mut want);
        if let Err(e) = check_close(&got, &want, REL) {
            panic!("add, n = {n}, seed {seed}: {e}");
        }
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn in_place_add_on_an_offset_slice_leaves_the_rest_untouched() {
        let Some(ctx) = gpu_or_skip("in_place_add_on_an_offset_slice") else {
            return;
        };
        let align = ctx.caps().storage_offset_alignment.max(4);
        let n = 1000u32;
        let x = Buffer::new(&ctx, "x", align + 4 * u64::from(n), MemoryKind::DeviceLocal).unwrap();
        let y = Buffer::new(&ctx, "y", 4 * u64::from(n), MemoryKind::DeviceLocal).unwrap();
        ctx.fill(&x, 0, x.size(), 1.0f32.to_bits()).unwrap();
        ctx.fill(&y, 0, y.size(), 2.0f32.to_bits()).unwrap();
        let xs = x.slice(align, 4 * u64::from(n)).unwrap();
        let add = Add::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        add.record(&mut chain, &xs, &y.whole(), &xs, n).unwrap();
        chain.run().unwrap();
        let mut got = vec![0f32; (x.size() / 4) as usize];
        ctx.download(&x, 0, &mut got).unwrap();
        let head = (align / 4) as usize;
        assert!(got[..head].iter().all(|&v| v == 1.0) && got[head..].iter().all(|&v| v == 3.0));
    }

    #[test]
    fn short_operands_are_a_shape_error() {
        let Some(ctx) = gpu_or_skip("short_operands_are_a_shape_error") else {
            return;
        };
        let small = Buffer::new(&ctx, "small", 16, MemoryKind::DeviceLocal).unwrap();
        let add = Add::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let err = add
            .record(
                &mut chain,
                &small.whole(),
                &small.whole(),
                &small.whole(),
                5,
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("small") && err.to_string().contains("5 floats"),
            "{err}"
        );
    }
}
