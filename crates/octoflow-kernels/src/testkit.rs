//! The shared kit of the kernel tests: random inputs from a seed printed on failure, device
//! buffers holding them, outputs poisoned with NaN before a run, and their read-back. Results
//! are compared with [`crate::check_close`].

use octoflow_gguf::GgmlType;
use octoflow_vk::{Buffer, Context, MemoryKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A fresh seed and its generator; the seed is printed so that a failing run can be repeated
/// (cargo shows it with the failure): `OCTOFLOW_TEST_SEED=<seed>` gives every test that seed.
pub fn seeded(test: &str) -> (u64, StdRng) {
    let seed: u64 = std::env::var("OCTOFLOW_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    println!("{test}: seed {seed}");
    (seed, StdRng::seed_from_u64(seed))
}

/// `len` floats uniform in -1 .. 1.
pub fn random(rng: &mut StdRng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

/// A device buffer holding `data`.
pub fn with<T: octoflow_vk::Plain>(ctx: &Context, name: &str, data: &[T]) -> Buffer {
    let b = Buffer::new(
        ctx,
        name,
        (std::mem::size_of_val(data) as u64).max(4),
        MemoryKind::DeviceLocal,
    )
    .unwrap();
    ctx.upload(&b, 0, data).unwrap();
    b
}

/// A device buffer of `n` floats, all NaN: an output the kernel fails to write never passes
/// [`crate::check_close`].
pub fn poisoned(ctx: &Context, name: &str, n: usize) -> Buffer {
    let bytes = 4 * n as u64;
    let b = Buffer::new(ctx, name, bytes, MemoryKind::DeviceLocal).unwrap();
    ctx.fill(&b, 0, bytes, f32::NAN.to_bits()).unwrap();
    b
}

/// The first `n` floats of `b`.
pub fn read(ctx: &Context, b: &Buffer, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    ctx.download(b, 0, &mut v).unwrap();
    v
}

/// A device buffer holding `bytes`, zero-padded to whole 32-bit words (the shaders read `uint`s).
pub fn buffer_with(ctx: &Context, name: &str, bytes: &[u8]) -> Buffer {
    let size = (bytes.len() as u64).next_multiple_of(4);
    let b = Buffer::new(ctx, name, size, MemoryKind::DeviceLocal).unwrap();
    let mut padded = bytes.to_vec();
    padded.resize(size as usize, 0);
    ctx.upload(&b, 0, &padded).unwrap();
    b
}

/// Random `n_rows x n_cols` weights in `ty`'s encoding: uniform -1 .. 1 through the CPU
/// quantizer, or for the types without one (IQ4_NL, IQ4_XS) random blocks — random codes and
/// sub-block scales, the f16 `d` at each block's start chosen so that values stay within about
/// ±1 (code books reach ±127; IQ4_XS sub-block scales ±32 more).
pub fn random_weights(rng: &mut StdRng, ty: GgmlType, n_rows: usize, n_cols: usize) -> Vec<u8> {
    use octoflow_gguf::quant;
    let mut q = vec![0u8; quant::quantized_size(ty, n_rows * n_cols).unwrap()];
    if quant::can_quantize(ty) {
        let f: Vec<f32> = (0..n_rows * n_cols)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        quant::quantize(ty, &f, &mut q).unwrap();
        return q;
    }
    let d_max = match ty {
        GgmlType::IQ4_NL => 1.0 / 127.0,
        GgmlType::IQ4_XS => 1.0 / (32.0 * 127.0),
        _ => panic!("random_weights: no quantizer and no block recipe for {ty}"),
    };
    rng.fill(&mut q[..]);
    for b in q.chunks_exact_mut(ty.type_size()) {
        let d = half::f16::from_f32(rng.gen_range(-d_max..d_max));
        b[..2].copy_from_slice(&d.to_bits().to_le_bytes());
    }
    q
}

/// A column count for `ty`: 256-element super-blocks 256..1024, 32-element blocks 96..1024,
/// floats any (odd too).
pub fn random_cols(rng: &mut StdRng, ty: GgmlType) -> usize {
    match ty.block_size() {
        1 => rng.gen_range(1..700),
        bs => bs * rng.gen_range((96 / bs).max(1)..=1024 / bs),
    }
}

/// `got[i]` within `rel` of `want[i]` (relative to the larger of |want[i]| and 1% of the
/// largest |want|, as `check_close`) plus `slack[i]` — what 8-bit codes of x at a rounding
/// boundary may move it (the integer-dot kernels' references return it); NaN fails.
pub fn check_with_slack(got: &[f32], want: &[f32], slack: &[f64], rel: f64, what: &str) {
    assert_eq!(
        (got.len(), slack.len()),
        (want.len(), want.len()),
        "{what}: lengths"
    );
    let scale = want.iter().fold(0f64, |m, &w| m.max(f64::from(w).abs()));
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(slack).enumerate() {
        assert!(g.is_finite(), "{what}: output {i} is {g} (reference {w})");
        let bound = rel * f64::from(w).abs().max(0.01 * scale) + 1.01 * s;
        let err = (f64::from(g) - f64::from(w)).abs();
        assert!(
            err <= bound,
            "{what}: output {i}: {g} vs reference {w} (error {err:.3e} > {bound:.3e})"
        );
    }
}

/// Whether `words` are `x` (rows of `n_cols`) quantized in `quantize_q8.comp`'s layout
/// ([`crate::linear::q8_blocks`]' codes, each code one step off at most where its value
/// lies at a rounding boundary; each block's d within a few ulps of max|v| / 127 — a GPU's
/// division need not round correctly — and d times the sum of its codes; a factor 1 per
/// row).
pub fn check_q8_layout(words: &[u32], x: &[f32], n_cols: usize) -> std::result::Result<(), String> {
    let n = x.len() / n_cols;
    let nb = n_cols / 32;
    let sbase = n * n_cols / 4;
    let f = |i: usize| f32::from_bits(words[i]);
    for t in 0..n {
        let row = &x[t * n_cols..(t + 1) * n_cols];
        let (deq, steps) = crate::linear::q8_blocks(row, None);
        for b in 0..nb {
            let (d, ds) = (f(sbase + 2 * (t * nb + b)), f(sbase + 2 * (t * nb + b) + 1));
            let amax = row[32 * b..32 * b + 32]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            let want_d = amax / 127.0;
            if !within(f64::from(d), f64::from(want_d), 1e-6 * f64::from(want_d)) {
                return Err(format!("row {t} block {b}: d {d}, want {want_d}"));
            }
            let mut sum = 0i32;
            for j in 0..32 {
                let c = t * n_cols + 32 * b + j;
                let code = i32::from(((words[c / 4] >> (8 * (c % 4))) & 0xFF) as u8 as i8);
                sum += code;
                let (got, want) = (f64::from(d) * f64::from(code), deq[32 * b + j]);
                if !within(got, want, steps[32 * b + j] + 1e-6 * want.abs()) {
                    return Err(format!(
                        "row {t} value {}: code {code} is {got}, want {want}",
                        32 * b + j
                    ));
                }
            }
            let want_ds = d * sum as f32;
            if !within(
                f64::from(ds),
                f64::from(want_ds),
                1e-6 * f64::from(want_ds.abs()),
            ) {
                return Err(format!(
                    "row {t} block {b}: d * sum {ds}, want {}",
                    d * sum as f32
                ));
            }
        }
        if f(sbase + 2 * n * nb + t) != 1.0 {
            return Err(format!(
                "row {t}: factor {}, want 1",
                f(sbase + 2 * n * nb + t)
            ));
        }
    }
    Ok(())
}

/// |a - b| <= tol (false where either is NaN).
fn within(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}
