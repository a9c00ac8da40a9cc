//! Gated linear unit (shader `glu.comp`): `out[i] = act(gate[i]) * up[i]`, f32.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::need;
use crate::shaders;

/// Invocations per workgroup (`local_size_x` in `glu.comp`).
const LOCAL_SIZE: u32 = 256;

/// The activation applied to the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GluOp {
    /// `x * sigmoid(x)` (SwiGLU: llama, qwen2).
    Silu,
    /// GELU, tanh approximation `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (GeGLU: gemma).
    GeluTanh,
}

impl GluOp {
    /// The shaders' code of the activation (`op` in `glu.glsl`).
    pub(crate) fn code(self) -> u32 {
        match self {
            GluOp::Silu => 0,
            GluOp::GeluTanh => 1,
        }
    }
}

/// The GLU kernel, built once per device.
pub struct Glu {
    pipeline: Pipeline,
}

impl Glu {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Glu {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::GLU, 3, 8))?,
        })
    }

    /// Records `out[i] = act(gate[i]) * up[i]` over `n` f32 elements (any layout, e.g.
    /// `[n_tokens, n_ff]`). `out` may alias `gate` or `up`.
    pub fn record(
        &self,
        chain: &mut Chain,
        gate: &BufferSlice,
        up: &BufferSlice,
        out: &BufferSlice,
        n: u32,
        op: GluOp,
    ) -> Result<()> {
        for (name, s) in [("gate", gate), ("up", up), ("out", out)] {
            need("glu", name, s, u128::from(n))?;
        }
        let groups = chain.context().groups_1d(u64::from(n), LOCAL_SIZE)?;
        chain.dispatch(
            &self.pipeline,
            &[gate.clone(), up.clone(), out.clone()],
            &Push::new().u32(n).u32(op.code()),
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: `out[i] = act(gate[i]) * up[i]`.
pub fn glu_ref(gate: &[f32], up: &[f32], out: &mut [f32], op: GluOp) {
    const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = match op {
            GluOp::Silu => g / (1.0 + (-g).exp()) * u,
            // 0.5 g (1 + tanh(v)) as g · sigmoid(2v), in f64: 1 + tanh(v) cancels for negative
            // g (in f32 a few digits of GELU's tail are left, in f64 none past g ≈ -6)
            GluOp::GeluTanh => {
                let g = f64::from(g);
                let v = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
                (g / (1.0 + (-2.0 * v).exp()) * f64::from(u)) as f32
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{poisoned, read, with};

    /// exp on the GPU is a few ulps off (the reference evaluates the shader's GELU form
    /// `g * sigmoid(2u)` in f64): 1e-5.
    const REL: f32 = 1e-5;

    #[test]
    fn gpu_glu_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("gpu_glu_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = Glu::new(&ctx).unwrap();
        for op in [GluOp::Silu, GluOp::GeluTanh] {
            for n in [1usize, 255, 8960, 37 * 1536 + 3] {
                let mut g: Vec<f32> = (0..n).map(|_| rng.gen_range(-12.0..12.0)).collect();
                let mut u: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                // one clearly nonzero output, so that check_close's near-zero floor is meaningful
                // even for n = 1 (far-negative gates give ~1e-30 here and exactly 0 in the tanh
                // form of the reference)
                (g[0], u[0]) = (rng.gen_range(1.0..12.0), rng.gen_range(1.0..3.0));
                let (gb, ub) = (with(&ctx, "gate", &g), with(&ctx, "up", &u));
                let ob = poisoned(&ctx, "out", n);
                let mut chain = Chain::new(&ctx).unwrap();
                k.record(
                    &mut chain,
                    &gb.whole(),
                    &ub.whole(),
                    &ob.whole(),
                    n as u32,
                    op,
                )
                .unwrap();
                // the in-place run overwrites the gate the first one reads
                chain.barrier().unwrap();
                k.record(
                    &mut chain,
                    &gb.whole(),
                    &ub.whole(),
                    &gb.whole(),
                    n as u32,
                    op,
                )
                .unwrap();
                chain.run().unwrap();
                let mut want = vec![0f32; n];
                glu_ref(&g, &u, &mut want, op);
                for (what, b) in [("out", &ob), ("in place", &gb)] {
                    if let Err(e) = check_close(&read(&ctx, b, n), &want, REL) {
                        panic!("glu {op:?} {what} n = {n}, seed {seed}: {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn short_up_is_a_shape_error() {
        let Some(ctx) = gpu_or_skip("glu_short_up") else {
            return;
        };
        let g = poisoned(&ctx, "g", 64);
        let u = poisoned(&ctx, "ffn_up", 10);
        let k = Glu::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let err = k
            .record(
                &mut chain,
                &g.whole(),
                &u.whole(),
                &g.whole(),
                64,
                GluOp::Silu,
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("up") && err.contains("ffn_up"), "{err}");
    }
}
