//! End of a generation step (shader `advance.comp`): records the sampled token, advances the
//! position and sets the stop flag, all on the GPU, so a chain can run many decode steps per
//! submit. The control block is a small u32 buffer whose layout is [`ctl`]; the CPU writes it
//! before a submit and reads it after.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::{KernelError, Result};
use crate::shaders;

/// Word indices of the control block (mirrored as constants in `advance.comp`).
pub mod ctl {
    /// Position of the next token fed to the model.
    pub const POS: u32 = 0;
    /// The next token fed to the model (the sampler writes it here).
    pub const TOKEN: u32 = 1;
    /// Tokens generated so far.
    pub const N_GEN: u32 = 2;
    /// 0 while running, else one of the `STOP_*` reasons.
    pub const STOP: u32 = 3;
    /// Generation stops when `N_GEN` reaches this.
    pub const MAX_GEN: u32 = 4;
    /// Context size: generation stops when `POS + 1 >= N_CTX`.
    pub const N_CTX: u32 = 5;
    /// Tokens written to the out list since the CPU last reset this.
    pub const N_OUT: u32 = 6;
    /// Number of end-of-generation ids at `EOG..`.
    pub const N_EOG: u32 = 7;
    /// First end-of-generation id.
    pub const EOG: u32 = 8;
    /// Most end-of-generation ids the block holds.
    pub const MAX_EOG: u32 = 8;
    /// Words in the block.
    pub const WORDS: u32 = EOG + MAX_EOG;
    /// Stopped on an end-of-generation token (which is recorded).
    pub const STOP_EOG: u32 = 1;
    /// Stopped at `MAX_GEN` tokens.
    pub const STOP_LENGTH: u32 = 2;
    /// Stopped because the context is full.
    pub const STOP_CONTEXT: u32 = 3;
}

/// The step-advance kernel, built once per device.
pub struct Advance {
    pipeline: Pipeline,
}

impl Advance {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Advance {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::ADVANCE, 2, 8))?,
        })
    }

    /// Records one advance: unless stopped, appends `ctl[TOKEN]` to `out` (u32, `out_len`
    /// entries), counts it, moves `ctl[POS]` on by `n_fed` and sets `ctl[STOP]`.
    pub fn record(
        &self,
        chain: &mut Chain,
        ctl_block: &BufferSlice,
        out: &BufferSlice,
        out_len: u32,
        n_fed: u32,
    ) -> Result<()> {
        let shape = |detail: String| KernelError::Shape {
            op: "advance",
            detail,
        };
        if ctl_block.size < 4 * u64::from(ctl::WORDS) {
            return Err(shape(format!(
                "control block ({}) holds {} bytes, needs {}",
                ctl_block.buffer.name(),
                ctl_block.size,
                4 * ctl::WORDS
            )));
        }
        if out.size < 4 * u64::from(out_len) {
            return Err(shape(format!(
                "out ({}) holds {} bytes, {out_len} tokens need {}",
                out.buffer.name(),
                out.size,
                4 * out_len
            )));
        }
        chain.dispatch(
            &self.pipeline,
            &[ctl_block.clone(), out.clone()],
            &Push::new().u32(n_fed).u32(out_len),
            [1, 1, 1],
        )?;
        Ok(())
    }
}

/// CPU reference of [`Advance::record`] on a control block `c` and out list `out`.
pub fn advance_ref(c: &mut [u32], out: &mut [u32], n_fed: u32) {
    use ctl::*;
    let at = |w: u32| w as usize;
    if c[at(STOP)] != 0 {
        return;
    }
    let tok = c[at(TOKEN)];
    let n_out = c[at(N_OUT)] as usize;
    if n_out < out.len() {
        out[n_out] = tok;
    }
    c[at(N_OUT)] += 1;
    c[at(N_GEN)] += 1;
    c[at(POS)] += n_fed;
    let n_eog = c[at(N_EOG)].min(MAX_EOG) as usize;
    let eog = c[at(EOG)..at(EOG) + n_eog].contains(&tok);
    c[at(STOP)] = if eog {
        STOP_EOG
    } else if c[at(N_GEN)] >= c[at(MAX_GEN)] {
        STOP_LENGTH
    } else if c[at(POS)] + 1 >= c[at(N_CTX)] {
        STOP_CONTEXT
    } else {
        0
    };
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use octoflow_vk::{Buffer, MemoryKind};
    use rand::Rng;

    use super::ctl::*;
    use super::*;

    #[test]
    fn repeated_advances_match_the_reference_and_stop_for_each_reason() {
        let Some(ctx) = gpu_or_skip("advance_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let adv = Advance::new(&ctx).unwrap();
        let out_len = 6u32;
        let c = Buffer::new(&ctx, "ctl", 4 * u64::from(WORDS), MemoryKind::Upload).unwrap();
        let o = Buffer::new(&ctx, "out", 4 * u64::from(out_len), MemoryKind::Upload).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        adv.record(&mut chain, &c.whole(), &o.whole(), out_len, 1)
            .unwrap();
        let mut reasons = std::collections::HashSet::new();
        for case in 0..40 {
            let mut cpu = vec![0u32; WORDS as usize];
            cpu[POS as usize] = rng.gen_range(0..20);
            cpu[MAX_GEN as usize] = rng.gen_range(1..8);
            cpu[N_CTX as usize] = rng.gen_range(2..30);
            cpu[N_EOG as usize] = rng.gen_range(0..3);
            for i in 0..MAX_EOG {
                cpu[(EOG + i) as usize] = rng.gen_range(0..10);
            }
            let mut cpu_out = vec![u32::MAX; out_len as usize];
            c.write(0, &cpu).unwrap();
            o.write(0, &cpu_out).unwrap();
            for step in 0..8 {
                let tok = rng.gen_range(0..10);
                cpu[TOKEN as usize] = tok;
                c.write(4 * u64::from(TOKEN), &[tok]).unwrap();
                chain.run().unwrap();
                advance_ref(&mut cpu, &mut cpu_out, 1);
                let mut got = vec![0u32; WORDS as usize];
                c.read(0, &mut got).unwrap();
                let mut got_out = vec![0u32; out_len as usize];
                o.read(0, &mut got_out).unwrap();
                assert_eq!(got, cpu, "seed {seed}, case {case}, step {step}");
                assert_eq!(got_out, cpu_out, "seed {seed}, case {case}, step {step}");
            }
            reasons.insert(cpu[STOP as usize]);
        }
        for r in [STOP_EOG, STOP_LENGTH, STOP_CONTEXT] {
            assert!(reasons.contains(&r), "seed {seed}: reason {r} never seen");
        }
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn the_reference_stops_in_the_cpu_generation_order() {
        let mut c = vec![0u32; WORDS as usize];
        c[MAX_GEN as usize] = 1;
        c[N_CTX as usize] = 2;
        c[N_EOG as usize] = 1;
        c[EOG as usize] = 5;
        c[TOKEN as usize] = 5;
        let mut out = vec![0u32; 2];
        advance_ref(&mut c, &mut out, 1);
        // All three apply; the token is recorded and the end-of-generation reason wins.
        assert_eq!(
            (c[STOP as usize], out[0], c[POS as usize]),
            (STOP_EOG, 5, 1)
        );
        let before = c.clone();
        advance_ref(&mut c, &mut out, 1);
        assert_eq!(c, before, "a stopped block does not move");
    }
}
