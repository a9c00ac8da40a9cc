//! Gate of one step of a multi-step chain (shader `gate.comp`): fills a gated span's
//! indirect-dispatch arguments with their template, or with zeros once the control block's stop
//! flag is set, so the rest of a recorded decode chain costs nothing after generation ends.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::{KernelError, Result};
use crate::shaders;

/// The gate kernel, built once per device.
pub struct Gate {
    pipeline: Pipeline,
}

impl Gate {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Gate {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::GATE, 3, 8))?,
        })
    }

    /// Records `args[i] = ctl[stop_word] != 0 ? 0 : template[i]` for `i < n_words`.
    ///
    /// `ctl` is a u32 control block, `template` the u32 words of a gated span's workgroup
    /// counts (`octoflow_vk::gate_words`), `args` the span's args buffer (`n_words` u32).
    pub fn record(
        &self,
        chain: &mut Chain,
        ctl: &BufferSlice,
        stop_word: u32,
        template: &BufferSlice,
        args: &BufferSlice,
        n_words: u32,
    ) -> Result<()> {
        let need = 4 * u64::from(n_words);
        for (name, s, bytes) in [
            ("ctl", ctl, 4 * u64::from(stop_word) + 4),
            ("template", template, need),
            ("args", args, need),
        ] {
            if s.size < bytes {
                let detail = format!(
                    "{name} ({}) holds {} bytes, needs {bytes}",
                    s.buffer.name(),
                    s.size
                );
                return Err(KernelError::Shape { op: "gate", detail });
            }
        }
        chain.dispatch(
            &self.pipeline,
            &[ctl.clone(), template.clone(), args.clone()],
            &Push::new().u32(n_words).u32(stop_word),
            [1, 1, 1],
        )?;
        Ok(())
    }
}

/// CPU reference of [`Gate::record`].
pub fn gate_ref(ctl: &[u32], stop_word: usize, template: &[u32], args: &mut [u32]) {
    let stopped = ctl[stop_word] != 0;
    for (a, &t) in args.iter_mut().zip(template) {
        *a = if stopped { 0 } else { t };
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use octoflow_vk::{Buffer, MemoryKind};
    use rand::Rng;

    use super::*;

    #[test]
    fn gate_copies_the_template_or_zeros_by_the_stop_flag() {
        let Some(ctx) = gpu_or_skip("gate_copies_the_template_or_zeros") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let gate = Gate::new(&ctx).unwrap();
        for _ in 0..4 {
            let n = rng.gen_range(1..700u32);
            let template: Vec<u32> = (0..n).map(|_| rng.gen_range(1..1000)).collect();
            let stop_word = rng.gen_range(0..8u32);
            let mut ctl: Vec<u32> = (0..8).map(|_| rng.gen_range(0..3)).collect();
            if rng.gen_bool(0.5) {
                ctl[stop_word as usize] = 0;
            }
            let c = Buffer::new(&ctx, "ctl", 32, MemoryKind::Upload).unwrap();
            let t = Buffer::new(&ctx, "template", 4 * u64::from(n), MemoryKind::Upload).unwrap();
            let a = Buffer::new(&ctx, "args", 4 * u64::from(n), MemoryKind::DeviceLocal).unwrap();
            c.write(0, &ctl).unwrap();
            t.write(0, &template).unwrap();
            ctx.fill(&a, 0, a.size(), 0xDEAD_BEEF).unwrap();
            let mut chain = Chain::new(&ctx).unwrap();
            gate.record(&mut chain, &c.whole(), stop_word, &t.whole(), &a.whole(), n)
                .unwrap();
            chain.run().unwrap();
            let mut got = vec![0u32; n as usize];
            ctx.download(&a, 0, &mut got).unwrap();
            let mut want = vec![0u32; n as usize];
            gate_ref(&ctl, stop_word as usize, &template, &mut want);
            assert_eq!(got, want, "seed {seed}, n {n}, ctl {ctl:?}");
        }
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn a_short_template_is_a_shape_error() {
        let Some(ctx) = gpu_or_skip("gate_short_template") else {
            return;
        };
        let small = Buffer::new(&ctx, "small-template", 8, MemoryKind::Upload).unwrap();
        let big = Buffer::new(&ctx, "args", 64, MemoryKind::Upload).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let err = Gate::new(&ctx)
            .unwrap()
            .record(&mut chain, &big.whole(), 3, &small.whole(), &big.whole(), 6)
            .unwrap_err();
        assert!(err.to_string().contains("small-template"), "{err}");
    }
}
