//! Rotary position embedding in place (shader `rope.comp`), positions read from a GPU buffer,
//! and the angle table every RoPE kernel takes ([`RopeFreqs`]).

use octoflow_vk::{Buffer, BufferSlice, Chain, Context, MemoryKind, Pipeline, PipelineDesc, Push};

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

/// The angles of a rotation as every RoPE kernel (`rope`, `rope_store`, the fused decode
/// attention) takes them: pair `i < n_rot/2` of a token at position `p` turns by
/// `theta_i = p * freq_i` radians and its cos and sin are multiplied by `mscale`. The caller
/// computes the frequencies in f64 with everything that shapes them folded in (base, linear
/// scale, `rope_freqs` divisors, YaRN's blend of scaled and unscaled angles: octoflow-model's
/// `ops::rope_freqs`), so no shader repeats that math; they are bound as double-floats, which
/// keeps the angle exact to ~1e-7 rad at any position below 2^24 (see `rope.glsl`).
#[derive(Clone)]
pub struct RopeFreqs {
    /// `[n_rot/2, 2]` f32: pair `i`'s frequency as `hi + lo` ([`RopeFreqs::words`]).
    pub table: BufferSlice,
    /// Rotated dimensions: twice the table's pairs.
    pub n_rot: u32,
    /// Factor on cos and sin (YaRN's magnitude scale; 1 without).
    pub mscale: f32,
}

impl RopeFreqs {
    /// The double-float words `(hi, lo)` of each frequency.
    pub fn words(freqs: &[f64]) -> Vec<f32> {
        freqs
            .iter()
            .flat_map(|&f| {
                let hi = f as f32;
                [hi, (f - f64::from(hi)) as f32]
            })
            .collect()
    }

    /// Uploads the frequencies `freqs` (radians per position, one per rotated pair) into a
    /// buffer of their own named `name`.
    pub fn upload(ctx: &Context, name: &str, freqs: &[f64], mscale: f32) -> Result<Self> {
        const OP: &str = "rope_freqs";
        if freqs.is_empty() || freqs.len() > (u32::MAX / 4) as usize {
            return Err(bad(OP, format!("{name}: {} frequencies", freqs.len())));
        }
        if let Some(i) = freqs.iter().position(|f| !f.is_finite()) {
            return Err(bad(OP, format!("{name}: frequency {i} is {}", freqs[i])));
        }
        if !mscale.is_finite() {
            return Err(bad(OP, format!("{name}: mscale {mscale}")));
        }
        let words = Self::words(freqs);
        let buffer = Buffer::new(ctx, name, 4 * words.len() as u64, MemoryKind::DeviceLocal)?;
        ctx.upload(&buffer, 0, &words)?;
        Ok(RopeFreqs {
            table: buffer.whole(),
            n_rot: 2 * freqs.len() as u32,
            mscale,
        })
    }

    /// Checks the table against a head of `head_dim` (shared by every RoPE kernel): `n_rot`
    /// in `2..=head_dim`, the table long enough, a finite `mscale`.
    pub(crate) fn check(&self, op: &'static str, head_dim: u32) -> Result<()> {
        if self.n_rot == 0 || !self.n_rot.is_multiple_of(2) || self.n_rot > head_dim {
            return Err(bad(
                op,
                format!(
                    "n_rot {} must be even, in 2..=head_dim {head_dim}",
                    self.n_rot
                ),
            ));
        }
        if !self.mscale.is_finite() {
            return Err(bad(op, format!("mscale {}", self.mscale)));
        }
        need(op, "freqs", &self.table, u128::from(self.n_rot))
    }
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
    /// Pair layout.
    pub mode: RopeMode,
    /// The angles (and `n_rot`: dims `>= n_rot` pass through).
    pub freqs: &'a RopeFreqs,
    /// u32 buffer; token `t` is at position `pos[pos_offset] + t` (below 2^24).
    pub pos: &'a BufferSlice,
    /// Index of the start position in `pos`.
    pub pos_offset: u32,
    /// How `pos` is read (one run of positions, or a per-token table).
    pub positions: Positions,
    /// Rotate by `-theta` instead: the transpose of the rotation (times `mscale`), i.e. RoPE's
    /// backward (it maps the gradient w.r.t. the rotated values to the gradient w.r.t. the
    /// inputs), and its inverse where `mscale` is 1.
    pub inverse: bool,
}

/// The RoPE kernel, built once per device.
pub struct Rope {
    pipeline: Pipeline,
}

impl Rope {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Rope {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::ROPE, 3, 36))?,
        })
    }

    /// Records the rotation of `a.x` in place (by `-theta` when `a.inverse`). Angles are computed
    /// in double-float on the GPU and reduced to a fraction of a turn before sin/cos, so large positions stay accurate.
    pub fn record(&self, chain: &mut Chain, a: &RopeArgs) -> Result<()> {
        const OP: &str = "rope";
        a.freqs.check(OP, a.head_dim)?;
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
        let n_rot = a.freqs.n_rot;
        let pairs = u64::from(a.n_tokens) * u64::from(a.n_heads) * u64::from(n_rot / 2);
        let groups = chain.context().groups_1d(pairs, LOCAL_SIZE)?;
        let push = Push::new()
            .u32(a.n_tokens)
            .u32(a.n_heads)
            .u32(a.head_dim)
            .u32(n_rot)
            .u32(u32::from(a.mode == RopeMode::Neox))
            .u32(a.pos_offset)
            .f32(a.freqs.mscale)
            .u32(a.positions.flag())
            .u32(u32::from(a.inverse));
        chain.dispatch(
            &self.pipeline,
            &[a.x.clone(), a.pos.clone(), a.freqs.table.clone()],
            &push,
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: rotates `x` (`[n_tokens, n_heads, head_dim]`) in place, token `t` at position
/// `start + t`, pair `i < freqs.len()` by `theta_i = (start + t) * freqs[i]` (f64), cos and sin
/// times `mscale`; rotation in f32.
pub fn rope_ref(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    mode: RopeMode,
    freqs: &[f64],
    mscale: f32,
    start: usize,
) {
    rotate_ref(x, (n_heads, head_dim, mode), freqs, mscale, start, 1.0);
}

/// CPU reference of RoPE's backward: [`rope_ref`] with every angle negated, i.e. the transpose
/// of the rotation (the inverse too where `mscale` is 1). Same parameters and layout as
/// [`rope_ref`].
pub fn rope_back_ref(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    mode: RopeMode,
    freqs: &[f64],
    mscale: f32,
    start: usize,
) {
    rotate_ref(x, (n_heads, head_dim, mode), freqs, mscale, start, -1.0);
}

/// The rotation of [`rope_ref`] by `sign * theta`; `shape` is `(n_heads, head_dim, mode)`.
fn rotate_ref(
    x: &mut [f32],
    shape: (usize, usize, RopeMode),
    freqs: &[f64],
    mscale: f32,
    start: usize,
    sign: f64,
) {
    let (n_heads, head_dim, mode) = shape;
    let half = freqs.len();
    let m = f64::from(mscale);
    for (t, token) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
        let angles: Vec<(f32, f32)> = freqs
            .iter()
            .map(|&f| {
                let theta = sign * (start + t) as f64 * f;
                ((theta.cos() * m) as f32, (theta.sin() * m) as f32)
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

/// Frequencies for tests: `scale * base^(-2i/n_rot) / ff[i]`, and with `yarn` each multiplied
/// by a random blend factor rising from `scale` to 1 over a random ramp of pairs (YaRN's
/// shape: unscaled low pairs, scaled high ones) and a random `mscale` in [1, 1.5] (else 1).
#[cfg(test)]
pub(crate) fn test_freqs(
    rng: &mut impl rand::Rng,
    n_rot: usize,
    base: f32,
    scale: f32,
    ff: Option<&[f32]>,
    yarn: bool,
) -> (Vec<f64>, f32) {
    let half = n_rot / 2;
    let (low, high) = if yarn {
        let low = rng.gen_range(0..half);
        (low as f64, rng.gen_range(low..=half) as f64 + 0.5)
    } else {
        (0.0, 0.0)
    };
    let freqs = (0..half)
        .map(|i| {
            let f = f64::from(base).powf(-2.0 * i as f64 / n_rot as f64);
            let f = f / ff.map_or(1.0, |ff| f64::from(ff[i]));
            if !yarn {
                return f * f64::from(scale);
            }
            // YaRN's mix: 1 (unscaled) below `low`, 0 (scaled) past `high`
            let mix = 1.0 - ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            f * (f64::from(scale) * (1.0 - mix) + mix)
        })
        .collect();
    let mscale = if yarn { rng.gen_range(1.0..1.5) } else { 1.0 };
    (freqs, mscale)
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
        // (n_tokens, n_heads, head_dim, n_rot, mode, base, scale, freq_factors, yarn, start)
        let cases = [
            (
                1,
                9,
                64,
                64,
                RopeMode::Normal,
                10_000.0,
                1.0,
                false,
                false,
                0,
            ),
            (37, 3, 64, 64, RopeMode::Neox, 1e6, 1.0, false, false, 123),
            (
                5,
                4,
                256,
                256,
                RopeMode::Neox,
                1e4,
                0.125,
                false,
                false,
                32_760,
            ),
            (
                3,
                2,
                128,
                64,
                RopeMode::Normal,
                5e5,
                1.0,
                true,
                false,
                32_768,
            ),
            (
                2,
                5,
                96,
                32,
                RopeMode::Neox,
                10_000.0,
                1.0,
                true,
                false,
                20_001,
            ),
            (
                1,
                1,
                2,
                2,
                RopeMode::Normal,
                10_000.0,
                1.0,
                false,
                false,
                32_767,
            ),
            // YaRN (gpt-oss's shape: NeoX, 64 rotated dims, scale 1/32) at large positions
            (
                4,
                8,
                64,
                64,
                RopeMode::Neox,
                150_000.0,
                1.0 / 32.0,
                false,
                true,
                32_000,
            ),
            (
                3,
                2,
                96,
                64,
                RopeMode::Normal,
                10_000.0,
                0.25,
                true,
                true,
                77,
            ),
        ];
        for (n_tok, n_heads, hd, n_rot, mode, base, scale, use_ff, yarn, start) in cases {
            let n = n_tok * n_heads * hd;
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let ff: Vec<f32> = (0..n_rot / 2).map(|_| rng.gen_range(1.0..40.0)).collect();
            let ff = use_ff.then_some(&ff[..]);
            let (freqs, mscale) = test_freqs(&mut rng, n_rot, base, scale, ff, yarn);
            let table = RopeFreqs::upload(&ctx, "rope_freqs", &freqs, mscale).unwrap();
            let xb = with(&ctx, "x", &x);
            let pb = with(&ctx, "pos", &[7u32, start as u32]);
            let args = RopeArgs {
                x: &xb.whole(),
                n_tokens: n_tok as u32,
                n_heads: n_heads as u32,
                head_dim: hd as u32,
                mode,
                freqs: &table,
                pos: &pb.whole(),
                pos_offset: 1,
                positions: Positions::Run,
                inverse: false,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(&mut chain, &args).unwrap();
            chain.run().unwrap();
            let mut want = x.clone();
            rope_ref(&mut want, n_heads, hd, mode, &freqs, mscale, start);
            let got = read(&ctx, &xb, n);
            if let Err(e) = check_close(&got, &want, REL) {
                panic!(
                    "rope {mode:?} {n_tok}x{n_heads}x{hd} n_rot {n_rot} yarn {yarn} at {start}, \
                     seed {seed}: {e}"
                );
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
            // the second word (where the sequence's block table starts) is not rope's business
            words.extend([p as u32, rng.gen()]);
        }
        let (freqs, mscale) = test_freqs(&mut rng, n_rot, 1e6, 1.0, None, true);
        let table = RopeFreqs::upload(&ctx, "rope_freqs", &freqs, mscale).unwrap();
        let xb = with(&ctx, "x", &x);
        let pb = with(&ctx, "pos", &words);
        let args = RopeArgs {
            x: &xb.whole(),
            n_tokens: n_tok as u32,
            n_heads: n_heads as u32,
            head_dim: hd as u32,
            mode: RopeMode::Neox,
            freqs: &table,
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
            rope_ref(row, n_heads, hd, RopeMode::Neox, &freqs, mscale, p);
        }
        if let Err(e) = check_close(&read(&ctx, &xb, x.len()), &want, REL) {
            panic!("rope position table, seed {seed}: {e}");
        }
    }

    #[test]
    fn odd_n_rot_short_tables_and_bad_frequencies_are_errors() {
        let Some(ctx) = gpu_or_skip("rope_shape_errors") else {
            return;
        };
        let xb = with(&ctx, "x", &[0f32; 64]);
        let pb = with(&ctx, "pos", &[0u32]);
        let k = Rope::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let mut table = RopeFreqs::upload(&ctx, "rope_freqs", &[1.0; 16], 1.0).unwrap();
        let wide = RopeFreqs::upload(&ctx, "rope_freqs", &[1.0; 17], 1.0).unwrap();
        let mut args = RopeArgs {
            x: &xb.whole(),
            n_tokens: 1,
            n_heads: 2,
            head_dim: 32,
            mode: RopeMode::Normal,
            freqs: &wide,
            pos: &pb.whole(),
            pos_offset: 0,
            positions: Positions::Run,
            inverse: false,
        };
        let err = k.record(&mut chain, &args).unwrap_err().to_string();
        assert!(err.contains("n_rot 34"), "{err}");
        // a table shorter than it claims
        table.n_rot = 32;
        table.table = table.table.buffer.slice(0, 64).unwrap();
        args.freqs = &table;
        let err = k.record(&mut chain, &args).unwrap_err().to_string();
        assert!(err.contains("freqs") && err.contains("rope_freqs"), "{err}");
        let err = RopeFreqs::upload(&ctx, "rope_freqs", &[1.0, f64::NAN], 1.0)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("frequency 1"), "{err}");
    }

    /// Runs rope on `x` (forward, then inverse when `round_trip`; inverse only otherwise) at the
    /// u32 `words` of `positions`, returning the result.
    fn run_rope(
        ctx: &octoflow_vk::Context,
        x: &[f32],
        shape: (usize, usize, RopeMode),
        freqs: &RopeFreqs,
        words: &[u32],
        positions: Positions,
        round_trip: bool,
    ) -> Vec<f32> {
        let (n_heads, hd, mode) = shape;
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
            mode,
            freqs,
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
        for (n_tok, n_heads, hd, n_rot, mode, yarn) in [
            (1, 1, 2, 2, RopeMode::Normal, false),
            (37, 3, 64, 64, RopeMode::Neox, false),
            (5, 2, 96, 32, RopeMode::Normal, true),
            (300, 2, 128, 128, RopeMode::Neox, false),
        ] {
            let x: Vec<f32> = (0..n_tok * n_heads * hd)
                .map(|_| rng.gen_range(-2.0..2.0))
                .collect();
            let shape = (n_heads, hd, mode);
            let (freqs, mscale) = test_freqs(&mut rng, n_rot, 1e4, 0.5, None, yarn);
            let table = RopeFreqs::upload(&ctx, "rope_freqs", &freqs, mscale).unwrap();
            let start = rng.gen_range(0..20_000usize);
            let run = [7u32, start as u32];
            let ctx_msg = format!("{mode:?} {n_tok}x{n_heads}x{hd} n_rot {n_rot}, seed {seed}");
            // inverse alone against rope_back_ref
            let got = run_rope(&ctx, &x, shape, &table, &run, Positions::Run, false);
            let mut want = x.clone();
            rope_back_ref(&mut want, n_heads, hd, mode, &freqs, mscale, start);
            if let Err(e) = check_close(&got, &want, REL) {
                panic!("inverse rope {ctx_msg}: {e}");
            }
            // forward then inverse is x times mscale², for a run and for a position table
            let m2 = mscale * mscale;
            let want: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, v)| if i % hd < n_rot { v * m2 } else { *v })
                .collect();
            let got = run_rope(&ctx, &x, shape, &table, &run, Positions::Run, true);
            if let Err(e) = check_close(&got, &want, REL) {
                panic!("rope round trip (run) {ctx_msg}: {e}");
            }
            let mut words = vec![3u32];
            for _ in 0..n_tok {
                words.extend([rng.gen_range(0..30_000u32), rng.gen()]);
            }
            let got = run_rope(&ctx, &x, shape, &table, &words, Positions::Table, true);
            if let Err(e) = check_close(&got, &want, REL) {
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
        let (freqs, mscale) = test_freqs(&mut rng, n_rot, 100.0, 0.5, Some(&ff), true);
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            let n = 3 * n_heads * hd;
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let dy: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let loss = |x: &[f32]| -> f64 {
                let mut y = x.to_vec();
                rope_ref(&mut y, n_heads, hd, mode, &freqs, mscale, 5);
                dot(&y, &dy)
            };
            let mut grad = dy.clone();
            rope_back_ref(&mut grad, n_heads, hd, mode, &freqs, mscale, 5);
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
