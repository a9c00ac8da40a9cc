//! Gated linear unit backward (shader `glu_back.comp`): gradients of `h = act(gate) * up`
//! w.r.t. `gate` and `up`, f32, elementwise.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::glu::GluOp;
use crate::operand::need;
use crate::shaders;

/// Invocations per workgroup (`local_size_x` in `glu_back.comp`).
const LOCAL_SIZE: u32 = 256;

/// The GLU backward kernel, built once per device.
pub struct GluBack {
    pipeline: Pipeline,
}

impl GluBack {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(GluBack {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::GLU_BACK, 5, 8))?,
        })
    }

    /// h = act(gate) * up ([`GluOp`]); given dh: dgate = dh * act'(gate) * up,
    /// dup = dh * act(gate), over `n` f32 elements (any layout, e.g. `[n_tokens, n_ff]`).
    /// dgate may alias gate and dup may alias up (in place); dh is separate.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        chain: &mut Chain,
        gate: &BufferSlice,
        up: &BufferSlice,
        dh: &BufferSlice,
        dgate: &BufferSlice,
        dup: &BufferSlice,
        n: u32,
        op: GluOp,
    ) -> Result<()> {
        for (name, s) in [
            ("gate", gate),
            ("up", up),
            ("dh", dh),
            ("dgate", dgate),
            ("dup", dup),
        ] {
            need("glu_back", name, s, u128::from(n))?;
        }
        let code = match op {
            GluOp::Silu => 0,
            GluOp::GeluTanh => 1,
        };
        let groups = chain.context().groups_1d(u64::from(n), LOCAL_SIZE)?;
        chain.dispatch(
            &self.pipeline,
            &[
                gate.clone(),
                up.clone(),
                dh.clone(),
                dgate.clone(),
                dup.clone(),
            ],
            &Push::new().u32(n).u32(code),
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference (f64 inside): `dgate[i] = dh[i] * act'(gate[i]) * up[i]`,
/// `dup[i] = dh[i] * act(gate[i])`, with `act` and its derivative
/// - SiLU: `act(g) = g σ(g)`, `act'(g) = σ(g) (1 + g (1 - σ(g)))`;
/// - GELU (tanh): `act(g) = ½ g (1 + tanh t)`, `t = √(2/π) (g + 0.044715 g³)`,
///   `act'(g) = ½ (1 + tanh t) + ½ g (1 - tanh² t) √(2/π) (1 + 3·0.044715 g²)`.
pub fn glu_back_ref(
    gate: &[f32],
    up: &[f32],
    dh: &[f32],
    dgate: &mut [f32],
    dup: &mut [f32],
    op: GluOp,
) {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    for i in 0..gate.len() {
        let g = f64::from(gate[i]);
        let (a, da) = match op {
            GluOp::Silu => {
                let s = 1.0 / (1.0 + (-g).exp());
                (g * s, s * (1.0 + g * (1.0 - s)))
            }
            GluOp::GeluTanh => {
                let t = (c * (g + 0.044_715 * g * g * g)).tanh();
                let da =
                    0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044_715 * g * g);
                (0.5 * g * (1.0 + t), da)
            }
        };
        let d = f64::from(dh[i]);
        dgate[i] = (d * da * f64::from(up[i])) as f32;
        dup[i] = (d * a) as f32;
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::glu_ref;
    use crate::grad_check::{central_difference, dot};
    use crate::testkit::{poisoned, read, with};

    /// exp on the GPU is a few ulps off and the f32 products add a few more; the derivative's
    /// sum `s + g·2s(1-s)·...` cancels for negative gates (SiLU's minimum near g = -1.28, GELU's
    /// near g = -0.75), where the values are small next to check_close's 1% floor: 5e-5
    /// (measured ~3e-6 on lavapipe).
    const REL: f32 = 5e-5;

    #[test]
    fn gpu_glu_back_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("gpu_glu_back_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = GluBack::new(&ctx).unwrap();
        for op in [GluOp::Silu, GluOp::GeluTanh] {
            for n in [1usize, 255, 8960, 37 * 1536 + 3] {
                let mut g: Vec<f32> = (0..n).map(|_| rng.gen_range(-12.0..12.0)).collect();
                let u: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                let dh: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
                // one gate well inside the active range, so that n = 1 has a nonzero scale
                g[0] = rng.gen_range(1.0..6.0);
                let (gb, ub, dhb) = (
                    with(&ctx, "gate", &g),
                    with(&ctx, "up", &u),
                    with(&ctx, "dh", &dh),
                );
                let (dgb, dub) = (poisoned(&ctx, "dgate", n), poisoned(&ctx, "dup", n));
                let n32 = n as u32;
                let mut chain = Chain::new(&ctx).unwrap();
                let (gs, us, dhs) = (gb.whole(), ub.whole(), dhb.whole());
                k.record(
                    &mut chain,
                    &gs,
                    &us,
                    &dhs,
                    &dgb.whole(),
                    &dub.whole(),
                    n32,
                    op,
                )
                .unwrap();
                // then in place over gate and up, after the first run has read them
                chain.barrier().unwrap();
                k.record(&mut chain, &gs, &us, &dhs, &gs, &us, n32, op)
                    .unwrap();
                chain.run().unwrap();
                let (mut want_g, mut want_u) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                glu_back_ref(&g, &u, &dh, &mut want_g, &mut want_u, op);
                for (what, b, want) in [
                    ("dgate", &dgb, &want_g),
                    ("dup", &dub, &want_u),
                    ("dgate in place", &gb, &want_g),
                    ("dup in place", &ub, &want_u),
                ] {
                    if let Err(e) = check_close(&read(&ctx, b, n), want, REL) {
                        panic!("glu_back {op:?} {what} n = {n}, seed {seed}: {e}");
                    }
                }
            }
        }
    }

    #[test]
    fn back_reference_is_the_gradient_of_the_forward_reference() {
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        for op in [GluOp::Silu, GluOp::GeluTanh] {
            let n = 24;
            let g: Vec<f32> = (0..n).map(|_| rng.gen_range(-5.0..5.0)).collect();
            let u: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
            let dh: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let (mut dg, mut du) = (vec![0f32; n], vec![0f32; n]);
            glu_back_ref(&g, &u, &dh, &mut dg, &mut du, op);
            let loss_g = |g: &[f32]| {
                let mut h = vec![0f32; n];
                glu_ref(g, &u, &mut h, op);
                dot(&h, &dh)
            };
            let loss_u = |u: &[f32]| {
                let mut h = vec![0f32; n];
                glu_ref(&g, u, &mut h, op);
                dot(&h, &dh)
            };
            // Only h[i] changes with gate[i] or up[i]: its f32 rounding (~1e-6 at |h| ~ 15) over
            // steps of 4e-2 and 8e-2 (Richardson-combined, which removes the h^2 term) is ~3e-5
            // absolute, ~2e-3 of check_close's 1% floor at worst (measured 3e-5): 2e-3. A
            // wrong derivative is off by O(1).
            for (what, got, x, fd) in [
                ("dgate", &dg, &g, central_difference(&g, 4e-2, loss_g)),
                ("dup", &du, &u, central_difference(&u, 4e-2, loss_u)),
            ] {
                assert_eq!(x.len(), got.len());
                if let Err(e) = check_close(got, &fd, 2e-3) {
                    panic!("glu_back_ref {op:?} {what} vs finite differences, seed {seed}: {e}");
                }
            }
        }
    }

    #[test]
    fn short_dh_is_a_shape_error() {
        let Some(ctx) = gpu_or_skip("glu_back_short_dh") else {
            return;
        };
        let g = poisoned(&ctx, "g", 64);
        let d = poisoned(&ctx, "grad_h", 10);
        let k = GluBack::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let gs = g.whole();
        let err = k
            .record(&mut chain, &gs, &gs, &d.whole(), &gs, &gs, 64, GluOp::Silu)
            .unwrap_err()
            .to_string();
        assert!(err.contains("dh") && err.contains("grad_h"), "{err}");
    }
}
