//! Rotary position embedding in place (shader `rope.comp`), positions read from a GPU buffer.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need, Positions};
use crate::shaders;

/// Invocations per workgroup (`local_size_x` in `rope.comp`).
const LOCAL_SIZE: u32 = 256;

/// Which dimensions form a rotated pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// Pairs `(2i, 2i+1)` (llama).
    Normal,
    /// Pairs `(i, i + n_rot/2)` (qwen2, gemma3).
    Neox,
}

/// Operands of one RoPE dispatch.
pub struct RopeArgs<'a> {
    /// `[n_tokens, n_heads, head_dim]` f32, rotated in place.
    pub x: &'a BufferSlice,
    /// Tokens.
    pub n_tokens: u32,
    /// Heads per token.
    pub n_heads: u32,
    /// Width of a head.
    pub head_dim: u32,
    /// Rotated dimensions (even, at most `head_dim`); dims `>= n_rot` pass through.
    pub n_rot: u32,
    /// Pair layout.
    pub mode: RopeMode,
    /// `theta_i = pos * scale * base^(-2i/n_rot) / freq_factors[i]` (radians).
    pub base: f32,
    /// Linear position scale (1 for none).
    pub scale: f32,
    /// `[n_rot/2]` f32 divisors of the frequencies (`rope_freqs`), or none.
    pub freq_factors: Option<&'a BufferSlice>,
    /// u32 buffer; token `t` is at position `pos[pos_offset] + t` (below 2^24).
    pub pos: &'a BufferSlice,
    /// Index of the start position in `pos`.
    pub pos_offset: u32,
    /// How `pos` is read (one run of positions, or a per-token table).
    pub positions: Positions,
    /// Rotate by `-theta` instead: the transpose of the rotation, i.e. RoPE's backward (it maps
    /// the gradient w.r.t. the rotated values to the gradient w.r.t. the inputs) and its inverse.
    pub inverse: bool,
}

/// Checks the rotation's parameters (shared by `rope` and `rope_store`): `n_rot` even in
/// `2..=head_dim`, a positive finite base, a finite scale.
pub(crate) fn check_angles(
    op: &'static str,
    n_rot: u32,
    head_dim: u32,
    base: f32,
    scale: f32,
) -> Result<()> {
    if n_rot == 0 || !n_rot.is_multiple_of(2) || n_rot > head_dim {
        return Err(bad(
            op,
            format!("n_rot {n_rot} must be even, in 2..=head_dim {head_dim}"),
        ));
    }
    if !(base > 0.0 && base.is_finite() && scale.is_finite()) {
        return Err(bad(op, format!("base {base} / scale {scale}")));
    }
    Ok(())
}

/// The RoPE kernel, built once per device.
pub struct Rope {
    pipeline: Pipeline,
}

impl Rope {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Rope {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::ROPE, 3, 48))?,
        })
    }

    /// Records the rotation of `a.x` in place (by `-theta` when `a.inverse`). Angles are computed
    /// in double-float on the GPU and reduced to a fraction of a turn before sin/cos, so large positions stay accurate.
    pub fn record(&self, chain: &mut Chain, a: &RopeArgs) -> Result<()> {
        const OP: &str = "rope";
        check_angles(OP, a.n_rot, a.head_dim, a.base, a.scale)?;
        let total = u128::from(a.n_tokens) * u128::from(a.n_heads) * u128::from(a.head_dim);
        if total == 0 || total > u128::from(u32::MAX) {
            return Err(bad(OP, format!("bad shape: {total} elements")));
        }
        need(OP, "x", a.x, total)?;
        need(
            OP,
            "pos",
            a.pos,
            u128::from(a.pos_offset) + a.positions.words(a.n_tokens),
        )?;
        if let Some(f) = a.freq_factors {
            need(OP, "freq_factors", f, u128::from(a.n_rot / 2))?;
        }
        // r = base^(-2/n_rot) in f64, handed over as a double-float (hi + lo)
        let r = f64::from(a.base).powf(-2.0 / f64::from(a.n_rot));
        let r_hi = r as f32;
        let r_lo = (r - f64::from(r_hi)) as f32;
        let pairs = u64::from(a.n_tokens) * u64::from(a.n_heads) * u64::from(a.n_rot / 2);
        let groups = chain.context().groups_1d(pairs, LOCAL_SIZE)?;
        let ff = a.freq_factors.unwrap_or(a.x);
        let push = Push::new()
            .u32(a.n_tokens)
            .u32(a.n_heads)
            .u32(a.head_dim)
            .u32(a.n_rot)
            .u32(u32::from(a.mode == RopeMode::Neox))
            .u32(u32::from(a.freq_factors.is_some()))
            .u32(a.pos_offset)
            .f32(a.scale)
            .f32(r_hi)
            .f32(r_lo)
            .u32(a.positions.flag())
            .u32(u32::from(a.inverse));
        chain.dispatch(
            &self.pipeline,
            &[a.x.clone(), a.pos.clone(), ff.clone()],
            &push,
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: rotates `x` (`[n_tokens, n_heads, head_dim]`) in place, token `t` at position
/// `start + t`; angles in f64 (`theta_i = pos * scale * base^(-2i/n_rot) / freq_factors[i]`),
/// rotation in f32.
#[allow(clippy::too_many_arguments)]
pub fn rope_ref(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
    mode: RopeMode,
    base: f32,
    scale: f32,
    freq_factors: Option<&[f32]>,
    start: usize,
) {
    let a = (n_heads, head_dim, n_rot, mode, base, scale);
    rotate_ref(x, a, freq_factors, start, 1.0);
}

/// CPU reference of RoPE's backward (and inverse): [`rope_ref`] with every angle negated, i.e.
/// the transpose of the rotation. Same parameters and layout as [`rope_ref`].
#[allow(clippy::too_many_arguments)]
pub fn rope_back_ref(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
    mode: RopeMode,
    base: f32,
    scale: f32,
    freq_factors: Option<&[f32]>,
    start: usize,
) {
    let a = (n_heads, head_dim, n_rot, mode, base, scale);
    rotate_ref(x, a, freq_factors, start, -1.0);
}

/// `(n_heads, head_dim, n_rot, mode, base, scale)` of the references.
type RopeShape = (usize, usize, usize, RopeMode, f32, f32);

/// The rotation of [`rope_ref`] by `sign * theta`.
fn rotate_ref(x: &mut [f32], a: RopeShape, freq_factors: Option<&[f32]>, start: usize, sign: f64) {
    let (n_heads, head_dim, n_rot, mode, base, scale) = a;
    let half = n_rot / 2;
    for (t, token) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
        let angles: Vec<(f32, f32)> = (0..half)
            .map(|i| {
                let inv_freq = f64::from(base).powf(-2.0 * i as f64 / n_rot as f64);
                let factor = freq_factors.map_or(1.0, |f| f64::from(f[i]));
                let theta = sign * (start + t) as f64 * f64::from(scale) * inv_freq / factor;
                (theta.cos() as f32, theta.sin() as f32)
            })
            .collect();
        for head in token.chunks_exact_mut(head_dim) {
            for (i, &(cos, sin)) in angles.iter().enumerate() {
                let (a, b) = match mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::grad_check::{central_difference, dot};
    use crate::testkit::{read, with};

    /// The angle is exact to ~1e-7 rad after the double-float turn reduction; f32 sin/cos of an
    /// argument within [-pi, pi] is off by up to ~5e-7 absolute on lavapipe, i.e. ~2e-5 of the
    /// 1% floor check_close uses near zero: 1e-4 relative, the brief's bound, also at position
    /// 32768 (where plain f32 angles would be off by ~1e-3 rad, i.e. ~1e-1 relative at the floor).
    const REL: f32 = 1e-4;

    #[test]
    fn gpu_rope_matches_the_reference_on_random_inputs_and_large_positions() {
        let Some(ctx) = gpu_or_skip("gpu_rope_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = Rope::new(&ctx).unwrap();
        // (n_tokens, n_heads, head_dim, n_rot, mode, base, scale, freq_factors, start)
        let cases = [
            (1, 9, 64, 64, RopeMode::Normal, 10_000.0, 1.0, false, 0),
            (37, 3, 64, 64, RopeMode::Neox, 1_000_000.0, 1.0, false, 123),
            (
                5,
                4,
                256,
                256,
                RopeMode::Neox,
                10_000.0,
                0.125,
                false,
                32_760,
            ),
            (
                3,
                2,
                128,
                64,
                RopeMode::Normal,
                500_000.0,
                1.0,
                true,
                32_768,
            ),
            (2, 5, 96, 32, RopeMode::Neox, 10_000.0, 1.0, true, 20_001),
            (1, 1, 2, 2, RopeMode::Normal, 10_000.0, 1.0, false, 32_767),
        ];
        for (n_tok, n_heads, hd, n_rot, mode, base, scale, use_ff, start) in cases {
            let n = n_tok * n_heads * hd;
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let ff: Vec<f32> = (0..n_rot / 2).map(|_| rng.gen_range(1.0..40.0)).collect();
            let xb = with(&ctx, "x", &x);
            let fb = with(&ctx, "ff", &ff);
            let pb = with(&ctx, "pos", &[7u32, start as u32]);
            let fs = fb.whole();
            let args = RopeArgs {
                x: &xb.whole(),
                n_tokens: n_tok as u32,
                n_heads: n_heads as u32,
                head_dim: hd as u32,
                n_rot: n_rot as u32,
                mode,
                base,
                scale,
                freq_factors: use_ff.then_some(&fs),
                pos: &pb.whole(),
                pos_offset: 1,
                positions: Positions::Run,
                inverse: false,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(&mut chain, &args).unwrap();
            chain.run().unwrap();
            let mut want = x.clone();
            let f = use_ff.then_some(&ff[..]);
            rope_ref(&mut want, n_heads, hd, n_rot, mode, base, scale, f, start);
            let got = read(&ctx, &xb, n);
            if let Err(e) = check_close(&got, &want, REL) {
                panic!("rope {mode:?} {n_tok}x{n_heads}x{hd} n_rot {n_rot} at {start}, seed {seed}: {e}");
            }
            // pass-through dims are bit-identical
            for (i, (g, w)) in got.iter().zip(&x).enumerate() {
                if i % hd >= n_rot {
                    assert_eq!(g.to_bits(), w.to_bits(), "dim {} changed", i % hd);
                }
            }
        }
    }

    #[test]
    fn position_table_rotates_each_token_at_its_own_position() {
        let Some(ctx) = gpu_or_skip("rope_position_table") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = Rope::new(&ctx).unwrap();
        let (n_tok, n_heads, hd, n_rot) = (9usize, 3usize, 64usize, 64usize);
        let x: Vec<f32> = (0..n_tok * n_heads * hd)
            .map(|_| rng.gen_range(-2.0..2.0))
            .collect();
        let pos: Vec<usize> = (0..n_tok).map(|_| rng.gen_range(0..30_000)).collect();
        let mut words = vec![1u32];
        for &p in &pos {
            // the second word (the sequence's first cache row) is not rope's business
            words.extend([p as u32, rng.gen()]);
        }
        let xb = with(&ctx, "x", &x);
        let pb = with(&ctx, "pos", &words);
        let args = RopeArgs {
            x: &xb.whole(),
            n_tokens: n_tok as u32,
            n_heads: n_heads as u32,
            head_dim: hd as u32,
            n_rot: n_rot as u32,
            mode: RopeMode::Neox,
            base: 1_000_000.0,
            scale: 1.0,
            freq_factors: None,
            pos: &pb.whole(),
            pos_offset: 1,
            positions: Positions::Table,
            inverse: false,
        };
        let mut chain = Chain::new(&ctx).unwrap();
        k.record(&mut chain, &args).unwrap();
        chain.run().unwrap();
        let mut want = x.clone();
        let w = n_heads * hd;
        for (t, &p) in pos.iter().enumerate() {
            let row = &mut want[t * w..(t + 1) * w];
            rope_ref(
                row,
                n_heads,
                hd,
                n_rot,
                RopeMode::Neox,
                1_000_000.0,
                1.0,
                None,
                p,
            );
        }
        if let Err(e) = check_close(&read(&ctx, &xb, x.len()), &want, REL) {
            panic!("rope position table, seed {seed}: {e}");
        }
    }

    #[test]
    fn odd_n_rot_and_short_freq_factors_are_shape_errors() {
        let Some(ctx) = gpu_or_skip("rope_shape_errors") else {
            return;
        };
        let xb = with(&ctx, "x", &[0f32; 64]);
        let fb = with(&ctx, "rope_freqs", &[1f32; 4]);
        let pb = with(&ctx, "pos", &[0u32]);
        let k = Rope::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let mut args = RopeArgs {
            x: &xb.whole(),
            n_tokens: 1,
            n_heads: 2,
            head_dim: 32,
            n_rot: 31,
            mode: RopeMode::Normal,
            base: 10_000.0,
            scale: 1.0,
            freq_factors: None,
            pos: &pb.whole(),
            pos_offset: 0,
            positions: Positions::Run,
            inverse: false,
        };
        let err = k.record(&mut chain, &args).unwrap_err().to_string();
        assert!(err.contains("n_rot 31"), "{err}");
        args.n_rot = 32;
        let f = fb.whole();
        args.freq_factors = Some(&f);
        let err = k.record(&mut chain, &args).unwrap_err().to_string();
        assert!(
            err.contains("freq_factors") && err.contains("rope_freqs"),
            "{err}"
        );
    }

    /// Runs rope on `x` (forward, then inverse when `round_trip`; inverse only otherwise) at the
    /// u32 `words` of `positions`, returning the result.
    fn run_rope(
        ctx: &octoflow_vk::Context,
        x: &[f32],
        shape: (usize, usize, usize, RopeMode),
        words: &[u32],
        positions: Positions,
        round_trip: bool,
    ) -> Vec<f32> {
        let (n_heads, hd, n_rot, mode) = shape;
        let k = Rope::new(ctx).unwrap();
        let xb = with(ctx, "x", x);
        let pb = with(ctx, "pos", words);
        let xs = xb.whole();
        let ps = pb.whole();
        let mut args = RopeArgs {
            x: &xs,
            n_tokens: (x.len() / (n_heads * hd)) as u32,
            n_heads: n_heads as u32,
            head_dim: hd as u32,
            n_rot: n_rot as u32,
            mode,
            base: 10_000.0,
            scale: 1.0,
            freq_factors: None,
            pos: &ps,
            pos_offset: 1,
            positions,
            inverse: false,
        };
        let mut chain = Chain::new(ctx).unwrap();
        if round_trip {
            k.record(&mut chain, &args).unwrap();
            chain.barrier().unwrap();
        }
        args.inverse = true;
        k.record(&mut chain, &args).unwrap();
        chain.run().unwrap();
        read(ctx, &xb, x.len())
    }

    #[test]
    fn gpu_inverse_rope_matches_the_back_reference_and_undoes_the_forward() {
        let Some(ctx) = gpu_or_skip("gpu_inverse_rope") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        for (n_tok, n_heads, hd, n_rot, mode) in [
            (1, 1, 2, 2, RopeMode::Normal),
            (37, 3, 64, 64, RopeMode::Neox),
            (5, 2, 96, 32, RopeMode::Normal),
            (300, 2, 128, 128, RopeMode::Neox),
        ] {
            let x: Vec<f32> = (0..n_tok * n_heads * hd)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let shape = (n_heads, hd, n_rot, mode);
            let start = rng.gen_range(0..20_000usize);
            let run = [7u32, start as u32];
            let ctx_msg = format!("{mode:?} {n_tok}x{n_heads}x{hd} n_rot {n_rot}, seed {seed}");
            // inverse alone against rope_back_ref
            let got = run_rope(&ctx, &x, shape, &run, Positions::Run, false);
            let mut want = x.clone();
            rope_back_ref(&mut want, n_heads, hd, n_rot, mode, 1e4, 1.0, None, start);
            if let Err(e) = check_close(&got, &want, REL) {
                panic!("inverse rope {ctx_msg}: {e}");
            }
            // forward then inverse is the identity, for a run and for a position table
            let got = run_rope(&ctx, &x, shape, &run, Positions::Run, true);
            if let Err(e) = check_close(&got, &x, REL) {
                panic!("rope round trip (run) {ctx_msg}: {e}");
            }
            let mut table = vec![3u32];
            for _ in 0..n_tok {
                table.extend([rng.gen_range(0..30_000u32), rng.gen()]);
            }
            let got = run_rope(&ctx, &x, shape, &table, Positions::Table, true);
            if let Err(e) = check_close(&got, &x, REL) {
                panic!("rope round trip (table) {ctx_msg}: {e}");
            }
        }
    }

    #[test]
    fn back_reference_is_the_gradient_of_the_forward_reference() {
        // L(x) = sum dy . rope(x); dL/dx = rope_back(dy). Central differences in f64 of the f32
        // forward (the actual step (x+h) - (x-h) after f32 rounding is used).
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let (n_heads, hd, n_rot) = (2usize, 8usize, 6usize);
        let ff: Vec<f32> = (0..n_rot / 2).map(|_| rng.gen_range(1.0..4.0)).collect();
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            let n = 3 * n_heads * hd;
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let dy: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let loss = |x: &[f32]| -> f64 {
                let mut y = x.to_vec();
                rope_ref(&mut y, n_heads, hd, n_rot, mode, 100.0, 0.5, Some(&ff), 5);
                dot(&y, &dy)
            };
            let mut grad = dy.clone();
            rope_back_ref(
                &mut grad,
                n_heads,
                hd,
                n_rot,
                mode,
                100.0,
                0.5,
                Some(&ff),
                5,
            );
            let fd = central_difference(&x, 4e-2, loss);
            // rope is linear: the only error is the f32 rounding of y (~1e-7 of a loss of ~10)
            // over steps of ±2e-2 and ±4e-2, up to ~5e-4 of check_close's 1% floor (measured
            // 3e-4): 2e-3. A wrong angle sign or pair is off by O(1).
            if let Err(e) = check_close(&grad, &fd, 2e-3) {
                panic!("rope_back_ref vs finite differences, {mode:?}, seed {seed}: {e}");
            }
        }
    }
}
