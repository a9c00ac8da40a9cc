//! Inverted dropout over a flat f32 vector (shader `dropout.comp`), with a counter-based mask:
//! element `i` is kept when [`dropout_uniform`]`(seed, salt, i) >= p`, so the backward pass
//! regenerates the same mask from `(seed, salt)` instead of storing it, and the GPU and the CPU
//! reference agree bit for bit.
//!
//! The seed lives in a u32 device buffer the host rewrites each training step, so a recorded
//! chain stays valid; the salt is a per-call constant (one per dropout site).

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

/// Invocations per workgroup (`local_size_x` in `dropout.comp`).
const LOCAL_SIZE: u32 = 256;

/// The lowbias32 integer finalizer: a bijection of u32 whose output bits each depend on every
/// input bit (`mix32` in `dropout.comp`).
fn mix32(mut v: u32) -> u32 {
    v ^= v >> 16;
    v = v.wrapping_mul(0x7feb_352d);
    v ^= v >> 15;
    v = v.wrapping_mul(0x846c_a68b);
    v ^= v >> 16;
    v
}

/// The counter-based uniform in [0,1) the shader uses (a documented integer hash of (seed, salt, i)); GPU and CPU bit-identical.
///
/// `key = mix32(seed ^ mix32(salt + 0x9E3779B9))`, `h = mix32(mix32(i + key) ^ key)` (wrapping
/// u32 arithmetic, `mix32` the lowbias32 finalizer), and the result is the top 24 bits of `h`
/// times 2⁻²⁴: a multiple of 2⁻²⁴, exact in f32.
pub fn dropout_uniform(seed: u32, salt: u32, i: u32) -> f32 {
    let key = mix32(seed ^ mix32(salt.wrapping_add(0x9E37_79B9)));
    let h = mix32(mix32(i.wrapping_add(key)) ^ key);
    (h >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// The factor kept values are multiplied by: `1 / (1 - p)` rounded to f32 (the shader gets this
/// value, so GPU and CPU multiply by the same number).
fn keep_scale(p: f32) -> f32 {
    (1.0 / (1.0 - f64::from(p))) as f32
}

/// The dropout kernel, built once per device.
pub struct Dropout {
    pipeline: Pipeline,
}

impl Dropout {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Dropout {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::DROPOUT, 3, 20))?,
        })
    }

    /// out[i] = keep(i) ? x[i] / (1 - p) : 0 over n values, keep(i) = uniform(seed, salt, i) >= p, where seed is the u32
    /// seed[seed_offset] (a GPU buffer the host rewrites each step, so a recorded chain stays valid) and salt a per-call constant.
    /// p in [0, 1). out may alias x.
    ///
    /// `x`, `out`: `[n]` f32. `seed`: u32, read at `seed_offset`. The division is a
    /// multiplication by `1 / (1 - p)` rounded to f32 (exactly what [`dropout_ref`] does);
    /// `uniform` is [`dropout_uniform`].
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        chain: &mut Chain,
        x: &BufferSlice,
        out: &BufferSlice,
        n: u32,
        p: f32,
        seed: &BufferSlice,
        seed_offset: u32,
        salt: u32,
    ) -> Result<()> {
        if !(0.0..1.0).contains(&p) {
            return Err(bad("dropout", format!("p = {p} is not in [0, 1)")));
        }
        need("dropout", "x", x, u128::from(n))?;
        need("dropout", "out", out, u128::from(n))?;
        need("dropout", "seed", seed, u128::from(seed_offset) + 1)?;
        let push = Push::new()
            .u32(n)
            .f32(p)
            .f32(keep_scale(p))
            .u32(salt)
            .u32(seed_offset);
        let groups = chain.context().groups_1d(u64::from(n), LOCAL_SIZE)?;
        chain.dispatch(
            &self.pipeline,
            &[x.clone(), out.clone(), seed.clone()],
            &push,
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: `out[i] = x[i] * (1 / (1 - p)) if dropout_uniform(seed, salt, i) >= p, else 0`,
/// over `x.len()` values (`out` as long).
pub fn dropout_ref(x: &[f32], out: &mut [f32], p: f32, seed: u32, salt: u32) {
    debug_assert_eq!(x.len(), out.len());
    let scale = keep_scale(p);
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = if dropout_uniform(seed, salt, i as u32) >= p {
            v * scale
        } else {
            0.0
        };
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use octoflow_vk::Buffer;
    use rand::Rng;

    use super::*;
    use crate::testkit::{poisoned, read, with};

    /// Runs dropout on the device: `x` into a NaN-poisoned output (or in place), seed word
    /// `seed` at offset 2 of a 4-word buffer.
    fn run(ctx: &Context, x: &[f32], p: f32, seed: u32, salt: u32, in_place: bool) -> Vec<f32> {
        let n = x.len();
        let xb = with(ctx, "x", x);
        let ob = if in_place {
            None
        } else {
            Some(poisoned(ctx, "out", n))
        };
        let sb = with(ctx, "seed", &[0xdead_beefu32, 1, seed, 3]);
        let op = Dropout::new(ctx).unwrap();
        let mut chain = Chain::new(ctx).unwrap();
        let out: &Buffer = ob.as_ref().unwrap_or(&xb);
        op.record(
            &mut chain,
            &xb.whole(),
            &out.whole(),
            n as u32,
            p,
            &sb.whole(),
            2,
            salt,
        )
        .unwrap();
        chain.run().unwrap();
        read(ctx, out, n)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    #[test]
    fn gpu_dropout_equals_the_reference_bit_for_bit() {
        let Some(ctx) = gpu_or_skip("gpu_dropout_equals_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        for (n, p, in_place) in [
            (1usize, 0.5f32, false),
            (1000, 0.1, false),
            (257, 0.9, true),
            (100_003, 0.3, false),
        ] {
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-4.0..4.0)).collect();
            let (s, salt) = (rng.gen::<u32>(), rng.gen::<u32>());
            let got = run(&ctx, &x, p, s, salt, in_place);
            let mut want = vec![0f32; n];
            dropout_ref(&x, &mut want, p, s, salt);
            // Same hash, same f32 product: exact equality, compared as bits.
            if let Some(i) = (0..n).find(|&i| got[i].to_bits() != want[i].to_bits()) {
                panic!(
                    "dropout n = {n}, p = {p}, seed {seed}: element {i}: {} vs {}",
                    got[i], want[i]
                );
            }
        }
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn kept_fraction_is_one_minus_p_and_salts_give_different_masks() {
        let Some(ctx) = gpu_or_skip("kept_fraction_is_one_minus_p") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let n = 1_000_000usize;
        let x = vec![1.0f32; n];
        for p in [0.1f32, 0.5, 0.75] {
            let s = rng.gen::<u32>();
            let salt = rng.gen::<u32>();
            let a = run(&ctx, &x, p, s, salt, false);
            let kept = a.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
            // Binomial: sd = sqrt(p (1-p) / n) <= 5e-4; 6 sd is never reached by chance.
            let sd = (f64::from(p) * (1.0 - f64::from(p)) / n as f64).sqrt();
            assert!(
                (kept - (1.0 - f64::from(p))).abs() < 6.0 * sd,
                "p = {p}, seed {seed}: kept {kept}"
            );
            // Kept values are exactly 1 / (1 - p) rounded to f32.
            assert!(a.iter().all(|&v| v == 0.0 || v == keep_scale(p)), "p = {p}");
            // Another salt (or seed): an independent mask, differing in ~2p(1-p) of the places.
            for (s2, salt2) in [(s, salt.wrapping_add(1)), (s.wrapping_add(1), salt)] {
                let b = run(&ctx, &x, p, s2, salt2, false);
                let differ = a.iter().zip(&b).filter(|(u, v)| u != v).count() as f64 / n as f64;
                let expect = 2.0 * f64::from(p) * (1.0 - f64::from(p));
                assert!(
                    (differ - expect).abs() < 0.01,
                    "p = {p}, seed {seed}: masks differ in {differ}"
                );
            }
        }
    }

    #[test]
    fn a_recorded_chain_follows_the_seed_buffer() {
        let Some(ctx) = gpu_or_skip("a_recorded_chain_follows_the_seed_buffer") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let n = 5000usize;
        let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let (xb, ob) = (with(&ctx, "x", &x), poisoned(&ctx, "out", n));
        let sb = with(&ctx, "seed", &[0u32]);
        let (p, salt) = (0.25f32, rng.gen::<u32>());
        let op = Dropout::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        op.record(
            &mut chain,
            &xb.whole(),
            &ob.whole(),
            n as u32,
            p,
            &sb.whole(),
            0,
            salt,
        )
        .unwrap();
        let mut masks = Vec::new();
        for s in [rng.gen::<u32>(), rng.gen::<u32>()] {
            ctx.upload(&sb, 0, &[s]).unwrap();
            chain.run().unwrap();
            let got = read(&ctx, &ob, n);
            let mut want = vec![0f32; n];
            dropout_ref(&x, &mut want, p, s, salt);
            assert_eq!(bits(&got), bits(&want), "step seed {s}, seed {seed}");
            masks.push(got);
        }
        assert_ne!(
            masks[0], masks[1],
            "seed {seed}: the mask ignored the new seed"
        );
    }

    #[test]
    fn p_zero_is_the_identity() {
        let Some(ctx) = gpu_or_skip("dropout_p_zero_is_the_identity") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let x: Vec<f32> = (0..4099).map(|_| rng.gen_range(-1e3..1e3)).collect();
        let got = run(&ctx, &x, 0.0, rng.gen(), rng.gen(), false);
        assert_eq!(bits(&got), bits(&x), "seed {seed}");
    }

    #[test]
    fn the_uniform_is_in_range_and_spread() {
        let mut hist = [0u32; 16];
        for i in 0..160_000u32 {
            let u = dropout_uniform(12345, 7, i);
            assert!((0.0..1.0).contains(&u), "{u}");
            hist[(u * 16.0) as usize] += 1;
        }
        // 10_000 expected per bin, sd 97.
        assert!(hist.iter().all(|&c| c.abs_diff(10_000) < 600), "{hist:?}");
        assert_ne!(dropout_uniform(0, 0, 0), dropout_uniform(0, 1, 0));
    }

    #[test]
    fn bad_operands_are_errors() {
        let Some(ctx) = gpu_or_skip("dropout_bad_operands") else {
            return;
        };
        let x = poisoned(&ctx, "acts", 10);
        let seed = with(&ctx, "seed_word", &[1u32]);
        let op = Dropout::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let (xw, sw) = (x.whole(), seed.whole());
        let err = op
            .record(&mut chain, &xw, &xw, 11, 0.1, &sw, 0, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("acts") && err.contains("11 values"), "{err}");
        let err = op
            .record(&mut chain, &xw, &xw, 10, 0.1, &sw, 1, 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("seed_word"), "{err}");
        for p in [1.0f32, -0.1, f32::NAN] {
            let err = op
                .record(&mut chain, &xw, &xw, 10, p, &sw, 0, 0)
                .unwrap_err()
                .to_string();
            assert!(err.contains("not in [0, 1)"), "{err}");
        }
    }
}
