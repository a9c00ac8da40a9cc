//! Tests of `sample.rs`: the GPU sampler against octoflow-core's CPU `Sampler`.

use octoflow_core::sampling::{Sampler, SamplingParams};
use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
use octoflow_vk::{Buffer, MemoryKind};
use rand::{Rng, SeedableRng};

use super::*;

/// Where the GPU token differs from the CPU's, some decision must sit within this distance of
/// its threshold (a running probability vs `u` or `top_p`, a probability vs the min-p floor):
/// the GPU's `exp` and division differ from the CPU's by a few ulps, and running sums of up to
/// 256 probabilities in [0, 1] accumulate that to well under 1e-5.
const BOUNDARY: f32 = 1e-5;

/// The CPU sampler with these parameters, its draw counter advanced to `step`.
fn cpu_sampler(s: &SamplerState, step: u64) -> Sampler {
    let mut sampler = Sampler::new(SamplingParams {
        temperature: s.temperature,
        top_k: s.top_k as usize,
        top_p: s.top_p,
        min_p: s.min_p,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: s.seed(),
        ..SamplingParams::default()
    });
    for _ in 0..step {
        sampler.sample(&[0.0]);
    }
    sampler
}

/// The smallest distance between a decision quantity of `sample_ref` and its threshold.
fn boundary_distance(logits: &[f32], s: &SamplerState) -> f32 {
    let mut c: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (i as u32, v))
        .collect();
    c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    c.truncate(s.top_k.clamp(1, MAX_TOP_K) as usize);
    let (e, sum) = exps(c.iter().map(|c| c.1));
    let p: Vec<f32> = e.iter().map(|e| e / sum).collect();
    let mut d = f32::INFINITY;
    let mut cum = 0.0f32;
    for &pi in &p {
        cum += pi;
        if s.top_p < 1.0 {
            d = d.min((cum - s.top_p).abs());
        }
        if s.min_p > 0.0 {
            d = d.min((pi - p[0] * s.min_p).abs());
        }
    }
    // The draw, over every prefix the filters could have kept.
    let u = uniform_ref(s.seed(), s.step());
    for keep in 1..=c.len() {
        let (e, sum) = exps(c[..keep].iter().map(|c| c.1 / s.temperature));
        let mut cum = 0.0f32;
        for e in e {
            cum += e / sum;
            d = d.min((cum - u).abs());
        }
    }
    d
}

/// Logits with exact ties, NaNs and some -inf; spread so that several tokens are likely.
fn sampling_logits(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    let levels = rng.gen_range(1..=12);
    let nan_frac = [0.0, 0.02, 0.5, 1.0][rng.gen_range(0..4)];
    let spread = [0.5f32, 3.0, 10.0][rng.gen_range(0..3)];
    (0..n)
        .map(|_| {
            let r: f64 = rng.gen();
            if r < nan_frac {
                f32::NAN
            } else if r < nan_frac + 0.005 {
                [f32::NEG_INFINITY, 0.0, -0.0][rng.gen_range(0..3)]
            } else if rng.gen_bool(0.4) {
                rng.gen_range(0..levels) as f32 * spread / 4.0
            } else {
                rng.gen_range(-spread..spread)
            }
        })
        .collect()
}

fn random_state(rng: &mut impl Rng) -> SamplerState {
    let temperature = [0.0f32, 0.1, 0.7, 1.0, 1.5, 3.0][rng.gen_range(0..6)];
    let top_k = [1, 2, 40, MAX_TOP_K][rng.gen_range(0..4)];
    let top_p = [1.0f32, 0.95, 0.5, rng.gen_range(0.0..1.0)][rng.gen_range(0..4)];
    let min_p = [0.0f32, 0.05, rng.gen_range(0.0..0.5)][rng.gen_range(0..3)];
    let step = match rng.gen_range(0..3) {
        0 => rng.gen_range(0..8),
        1 => 0xFFFF_FFFF, // the GPU's increment carries into the high word
        _ => rng.gen(),
    };
    SamplerState::new(rng.gen(), step, temperature, top_k, top_p, min_p)
}

#[test]
fn sample_ref_is_the_cpu_sampler() {
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..300 {
        let n = [1, 2, 7, 300, 1000][rng.gen_range(0..5)];
        let logits = sampling_logits(&mut rng, n);
        let mut s = random_state(&mut rng);
        s.step_hi = 0;
        s.step_lo %= 8;
        let want = cpu_sampler(&s, s.step()).sample(&logits);
        assert_eq!(sample_ref(&logits, &s), want, "{s:?}, seed {seed}");
    }
}

#[test]
fn supports_greedy_and_bounded_top_k() {
    assert!(Sample::supports(0.0, 0) && Sample::supports(-1.0, 100_000));
    assert!(Sample::supports(0.8, 1) && Sample::supports(0.8, MAX_TOP_K));
    assert!(!Sample::supports(0.8, 0) && !Sample::supports(0.8, MAX_TOP_K + 1));
}

#[test]
fn gpu_sample_matches_the_cpu_sampler_on_random_rows() {
    let Some(ctx) = gpu_or_skip("gpu_sample_matches_the_cpu_sampler") else {
        return;
    };
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sample = Sample::new(&ctx).unwrap();
    let mut cases: Vec<(Vec<f32>, SamplerState)> = Vec::new();
    for &(n, count) in &[
        (1, 10),
        (7, 30),
        (1000, 40),
        (49152, 16),
        (151936, 8),
        (262144, 4),
    ] {
        for _ in 0..count {
            cases.push((sampling_logits(&mut rng, n), random_state(&mut rng)));
        }
    }
    let stride = ctx.caps().storage_offset_alignment.max(STATE_BYTES);
    let states = Buffer::new(
        &ctx,
        "states",
        stride * cases.len() as u64,
        MemoryKind::DeviceLocal,
    )
    .unwrap();
    let out = Buffer::new(&ctx, "out", 4 * cases.len() as u64, MemoryKind::DeviceLocal).unwrap();
    ctx.fill(&out, 0, out.size(), 0xFFFF_FFFF).unwrap();
    let mut bufs = Vec::new();
    let mut chain = Chain::new(&ctx).unwrap();
    for (i, (logits, s)) in cases.iter().enumerate() {
        let b = Buffer::new(
            &ctx,
            "logits",
            4 * logits.len() as u64,
            MemoryKind::DeviceLocal,
        )
        .unwrap();
        ctx.upload(&b, 0, logits).unwrap();
        ctx.upload(&states, stride * i as u64, &s.to_words())
            .unwrap();
        let st = states.slice(stride * i as u64, STATE_BYTES).unwrap();
        let n = logits.len() as u32;
        sample
            .record(&mut chain, &b.whole(), n, &st, &out.whole(), i as u32)
            .unwrap();
        bufs.push(b);
    }
    chain.run().unwrap();
    let mut got = vec![0u32; cases.len()];
    ctx.download(&out, 0, &mut got).unwrap();
    let mut boundary_cases = 0;
    for (i, (logits, s)) in cases.iter().enumerate() {
        let want = sample_ref(logits, s);
        if s.step() < 8 {
            let cpu = cpu_sampler(s, s.step()).sample(logits);
            assert_eq!(want, cpu, "sample_ref vs Sampler, {s:?}, seed {seed}");
        }
        if got[i] != want {
            let d = boundary_distance(logits, s);
            assert!(
                d < BOUNDARY,
                "case {i} (n = {}, {s:?}), seed {seed}: GPU token {} vs CPU {want}, \
                 nearest boundary {d:e}",
                logits.len(),
                got[i]
            );
            boundary_cases += 1;
        }
        let mut words = [0u32; 8];
        ctx.download(&states, stride * i as u64, &mut words)
            .unwrap();
        let after = SamplerState::from_words(words);
        assert_eq!(
            after.step(),
            s.step().wrapping_add(1),
            "case {i}, seed {seed}"
        );
        assert_eq!(
            SamplerState {
                step_lo: s.step_lo,
                step_hi: s.step_hi,
                ..after
            },
            *s,
            "only the step changes"
        );
    }
    println!("{boundary_cases} boundary case(s) of {}", cases.len());
    assert_no_validation_errors(&ctx);
}

#[test]
fn gpu_sample_of_many_rows_in_one_dispatch() {
    let Some(ctx) = gpu_or_skip("gpu_sample_rows") else {
        return;
    };
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sample = Sample::new(&ctx).unwrap();
    let (n_rows, n) = (41usize, 5000usize);
    let logits: Vec<Vec<f32>> = (0..n_rows).map(|_| sampling_logits(&mut rng, n)).collect();
    let states: Vec<SamplerState> = (0..n_rows).map(|_| random_state(&mut rng)).collect();
    let flat: Vec<f32> = logits.concat();
    let words: Vec<u32> = states.iter().flat_map(|s| s.to_words()).collect();
    let lb = Buffer::new(
        &ctx,
        "logits",
        4 * flat.len() as u64,
        MemoryKind::DeviceLocal,
    )
    .unwrap();
    ctx.upload(&lb, 0, &flat).unwrap();
    let sb = Buffer::new(
        &ctx,
        "states",
        4 * words.len() as u64,
        MemoryKind::DeviceLocal,
    )
    .unwrap();
    ctx.upload(&sb, 0, &words).unwrap();
    let out = Buffer::new(
        &ctx,
        "out",
        4 * (n_rows as u64 + 1),
        MemoryKind::DeviceLocal,
    )
    .unwrap();
    ctx.fill(&out, 0, out.size(), 0xFFFF_FFFF).unwrap();
    let mut chain = Chain::new(&ctx).unwrap();
    sample
        .record_rows(
            &mut chain,
            &lb.whole(),
            n as u32,
            n_rows as u32,
            &sb.whole(),
            &out.whole(),
            1,
            None,
        )
        .unwrap();
    chain.run().unwrap();
    let mut got = vec![0u32; n_rows + 1];
    ctx.download(&out, 0, &mut got).unwrap();
    let mut after = vec![0u32; words.len()];
    ctx.download(&sb, 0, &mut after).unwrap();
    assert_eq!(got[0], u32::MAX, "the word before out_offset is untouched");
    for (r, (row, s)) in logits.iter().zip(&states).enumerate() {
        let want = sample_ref(row, s);
        if got[1 + r] != want {
            let d = boundary_distance(row, s);
            assert!(
                d < BOUNDARY,
                "row {r}, {s:?}, seed {seed}: GPU {} vs CPU {want}",
                got[1 + r]
            );
        }
        let a = SamplerState::from_words(after[8 * r..8 * r + 8].try_into().unwrap());
        assert_eq!(
            a.step(),
            s.step().wrapping_add(1),
            "row {r}'s own state advanced"
        );
    }
}

#[test]
fn gpu_steps_advance_through_a_chain_like_the_cpu_sampler() {
    let Some(ctx) = gpu_or_skip("gpu_steps_advance_through_a_chain") else {
        return;
    };
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sample = Sample::new(&ctx).unwrap();
    const STEPS: usize = 12;
    for temperature in [0.0f32, 1.0] {
        let n = 3000;
        // Flat logits: every draw depends on the step's random number.
        let logits: Vec<f32> = (0..n).map(|_| rng.gen_range(0.0..0.1)).collect();
        let s = SamplerState::new(rng.gen(), 0, temperature, 40, 1.0, 0.0);
        let lb = Buffer::new(&ctx, "logits", 4 * n as u64, MemoryKind::DeviceLocal).unwrap();
        ctx.upload(&lb, 0, &logits).unwrap();
        let st = Buffer::new(&ctx, "state", STATE_BYTES, MemoryKind::DeviceLocal).unwrap();
        ctx.upload(&st, 0, &s.to_words()).unwrap();
        let out = Buffer::new(&ctx, "out", 4 * STEPS as u64, MemoryKind::DeviceLocal).unwrap();
        ctx.fill(&out, 0, out.size(), 0xFFFF_FFFF).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        for i in 0..STEPS {
            sample
                .record(
                    &mut chain,
                    &lb.whole(),
                    n,
                    &st.whole(),
                    &out.whole(),
                    i as u32,
                )
                .unwrap();
            chain.barrier().unwrap();
        }
        chain.run().unwrap();
        let mut got = [0u32; STEPS];
        ctx.download(&out, 0, &mut got).unwrap();
        let mut cpu = cpu_sampler(&s, 0);
        for (i, &g) in got.iter().enumerate() {
            let want = cpu.sample(&logits);
            let at = SamplerState::new(s.seed(), i as u64, temperature, 40, 1.0, 0.0);
            assert!(
                g == want || boundary_distance(&logits, &at) < BOUNDARY,
                "T {temperature}, draw {i}, seed {seed}: GPU {g} vs CPU {want}"
            );
        }
        if temperature > 0.0 {
            let distinct: std::collections::HashSet<_> = got.iter().collect();
            assert!(
                distinct.len() > 1,
                "draws do not depend on the step: {got:?}"
            );
        }
        let mut words = [0u32; 8];
        ctx.download(&st, 0, &mut words).unwrap();
        assert_eq!(SamplerState::from_words(words).step(), STEPS as u64);
    }
}

#[test]
fn bad_shapes_are_clear_errors() {
    let Some(ctx) = gpu_or_skip("sample_bad_shapes") else {
        return;
    };
    let small = Buffer::new(&ctx, "small", 16, MemoryKind::DeviceLocal).unwrap();
    let state = Buffer::new(&ctx, "state", 32, MemoryKind::DeviceLocal).unwrap();
    let sample = Sample::new(&ctx).unwrap();
    let mut chain = Chain::new(&ctx).unwrap();
    let (w, s) = (small.whole(), state.whole());
    let err = sample
        .record(&mut chain, &w, 5, &s, &w, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("logits (small)") && err.contains("5 floats"),
        "{err}"
    );
    let err = sample
        .record(&mut chain, &w, 4, &w, &w, 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("state (small)") && err.contains("32"), "{err}");
    let err = sample
        .record(&mut chain, &w, 4, &s, &w, 4)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("out (small)") && err.contains("out_offset 4"),
        "{err}"
    );
    let err = sample
        .record(&mut chain, &w, 0, &s, &w, 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("n_vocab is 0"), "{err}");
    // Log-probabilities past the end of `out` (4 words): rows 3..5 do not fit.
    let err = sample
        .record_rows(&mut chain, &w, 2, 2, &s, &w, 0, Some(3))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("out (small)") && err.contains("out_offset 3"),
        "{err}"
    );
}

#[test]
fn gpu_sample_edge_rows() {
    let Some(ctx) = gpu_or_skip("gpu_sample_edge_rows") else {
        return;
    };
    let seed: u64 = rand::random();
    let sample = Sample::new(&ctx).unwrap();
    let nan = f32::NAN;
    let ninf = f32::NEG_INFINITY;
    let flat = vec![0.25f32; 151936];
    let cases: Vec<(Vec<f32>, SamplerState)> = vec![
        // All NaN: token 0.
        (
            vec![nan; 500],
            SamplerState::new(seed, 3, 1.0, 40, 0.9, 0.05),
        ),
        // +0.0 comes before -0.0 in the candidates' total order.
        (
            vec![-0.0, 0.0, -0.0],
            SamplerState::new(seed, 0, 1.0, 1, 1.0, 0.0),
        ),
        // One finite candidate among -inf and NaN.
        (
            vec![ninf, nan, -3.0, ninf],
            SamplerState::new(seed, 9, 0.7, 40, 0.5, 0.1),
        ),
        // 151936 exact ties: the MAX_TOP_K lowest ids, drawn uniformly by u.
        (
            flat.clone(),
            SamplerState::new(seed, 1, 1.0, MAX_TOP_K, 1.0, 0.0),
        ),
        (flat, SamplerState::new(seed ^ 1, 2, 0.5, 2, 1.0, 0.0)),
    ];
    for (logits, s) in cases {
        let want = sample_ref(&logits, &s);
        assert_eq!(want, cpu_sampler(&s, s.step()).sample(&logits));
        let b = Buffer::new(
            &ctx,
            "logits",
            4 * logits.len() as u64,
            MemoryKind::DeviceLocal,
        )
        .unwrap();
        ctx.upload(&b, 0, &logits).unwrap();
        let st = Buffer::new(&ctx, "state", STATE_BYTES, MemoryKind::DeviceLocal).unwrap();
        ctx.upload(&st, 0, &s.to_words()).unwrap();
        let out = Buffer::new(&ctx, "out", 4, MemoryKind::DeviceLocal).unwrap();
        ctx.fill(&out, 0, 4, 0xFFFF_FFFF).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let n = logits.len() as u32;
        sample
            .record(&mut chain, &b.whole(), n, &st.whole(), &out.whole(), 0)
            .unwrap();
        chain.run().unwrap();
        let mut got = [0u32];
        ctx.download(&out, 0, &mut got).unwrap();
        assert_eq!(got[0], want, "n = {n}, {s:?}, seed {seed}");
    }
}

/// Finite logits with exact ties and a few -inf (which add nothing to the sum): never all -inf.
fn logprob_logits(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    let spread = [0.5f32, 3.0, 10.0, 30.0][rng.gen_range(0..4)];
    let mut v: Vec<f32> = (0..n)
        .map(|_| match rng.gen_range(0..100) {
            0 => f32::NEG_INFINITY,
            1..=30 => rng.gen_range(0..6) as f32 * spread / 4.0,
            _ => rng.gen_range(-spread..spread),
        })
        .collect();
    v[rng.gen_range(0..n)] = rng.gen_range(-spread..spread);
    v
}

/// Each row's log-probability comes out beside its token, at temperature 0 (argmax's pass) and
/// above (the radix select's first pass), against `logprob_ref` of the token the GPU drew.
/// Bound: `check_close` at 1e-4. `l - max` is exact on both sides; `ln(sum)` carries the
/// relative error of the sum of `exp(l - max)` (in [1, n]), which the CPU takes sequentially
/// and the GPU online per invocation then by subgroups: a few ulps of `exp` each plus the
/// summation's rounding, ~√n·2⁻²⁴ in practice (≤ 2e-5 at n = 50,000) — far under 1e-4 of a
/// log-probability, or of 1% of the row group's largest (a near-zero one's floor). The outputs
/// start as NaN, so a row the kernel skips never passes.
#[test]
fn gpu_logprobs_match_the_cpu_reference() {
    let Some(ctx) = gpu_or_skip("gpu_logprobs_match_the_cpu_reference") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded("gpu_logprobs_match_the_cpu_reference");
    let sample = Sample::new(&ctx).unwrap();
    for (n, n_rows) in [(1usize, 3usize), (7, 8), (1000, 8), (5000, 6), (49152, 4)] {
        for greedy in [true, false] {
            let logits: Vec<Vec<f32>> = (0..n_rows).map(|_| logprob_logits(&mut rng, n)).collect();
            let states: Vec<SamplerState> = (0..n_rows)
                .map(|_| {
                    let mut s = random_state(&mut rng);
                    s.temperature = if greedy {
                        0.0
                    } else {
                        [0.1f32, 0.8, 1.0, 2.0][rng.gen_range(0..4)]
                    };
                    s
                })
                .collect();
            let flat: Vec<f32> = logits.concat();
            let words: Vec<u32> = states.iter().flat_map(|s| s.to_words()).collect();
            let lb = crate::testkit::with(&ctx, "logits", &flat);
            let sb = crate::testkit::with(&ctx, "states", &words);
            // [1 guard word | n_rows tokens | n_rows log-probs]: NaN everywhere to start.
            let out = crate::testkit::poisoned(&ctx, "out", 1 + 2 * n_rows);
            let mut chain = Chain::new(&ctx).unwrap();
            sample
                .record_rows(
                    &mut chain,
                    &lb.whole(),
                    n as u32,
                    n_rows as u32,
                    &sb.whole(),
                    &out.whole(),
                    1,
                    Some(1 + n_rows as u32),
                )
                .unwrap();
            chain.run().unwrap();
            let mut got = vec![0u32; 1 + 2 * n_rows];
            ctx.download(&out, 0, &mut got).unwrap();
            assert_eq!(got[0], f32::NAN.to_bits(), "the guard word is untouched");
            let tokens = &got[1..=n_rows];
            let lps: Vec<f32> = got[1 + n_rows..]
                .iter()
                .map(|&w| f32::from_bits(w))
                .collect();
            let mut want = Vec::with_capacity(n_rows);
            for (r, (row, s)) in logits.iter().zip(&states).enumerate() {
                let t = sample_ref(row, s);
                if tokens[r] != t {
                    let d = boundary_distance(row, s);
                    assert!(
                        !greedy && d < BOUNDARY,
                        "row {r}, {s:?}, seed {seed}: GPU token {} vs CPU {t}",
                        tokens[r]
                    );
                }
                want.push(logprob_ref(row, tokens[r]));
            }
            crate::check_close(&lps, &want, 1e-4)
                .unwrap_or_else(|e| panic!("n = {n}, greedy {greedy}, seed {seed}: {e}"));
        }
    }
    assert_no_validation_errors(&ctx);
}

#[test]
fn logprob_ref_is_log_softmax_at_temperature_one() {
    let l = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
    let z: f32 = l.iter().map(|v| v.exp()).sum();
    for t in 0..3 {
        let want = l[t] - z.ln();
        assert!((logprob_ref(&l, t as u32) - want).abs() < 1e-6);
    }
    assert_eq!(logprob_ref(&l, 3), f32::NEG_INFINITY);
    assert_eq!(
        logprob_ref(&l, 4),
        f32::NEG_INFINITY,
        "a token past the row"
    );
    assert!(
        logprob_ref(&[0.0, f32::NAN], 0).is_nan(),
        "NaN poisons the sum"
    );
}

/// A random row mask of one of several shapes for `logits` (possibly rewriting them so every
/// allowed logit is NaN or -inf), or `None` (unconstrained).
fn random_mask(rng: &mut impl Rng, logits: &mut [f32]) -> Option<Vec<u32>> {
    let n = logits.len();
    let mut words = vec![0u32; n.div_ceil(32)];
    let allow = |i: usize, w: &mut Vec<u32>| w[i / 32] |= 1 << (i % 32);
    match rng.gen_range(0..7) {
        0 => return None,
        1 => allow(rng.gen_range(0..n), &mut words),
        2 => (0..n)
            .filter(|_| rng.gen_bool(0.01))
            .for_each(|i| allow(i, &mut words)),
        3 => (0..n)
            .filter(|_| rng.gen_bool(0.5))
            .for_each(|i| allow(i, &mut words)),
        4 => (0..n).for_each(|i| allow(i, &mut words)),
        5 => {
            // Allowed tokens exist but none is live: the lowest allowed id.
            let picked: Vec<usize> = (0..n).filter(|_| rng.gen_bool(0.05)).collect();
            for i in picked {
                allow(i, &mut words);
                logits[i] = if rng.gen_bool(0.5) {
                    f32::NAN
                } else {
                    f32::NEG_INFINITY
                };
            }
        }
        _ => {} // nothing allowed: token 0
    }
    Some(words)
}

#[test]
fn sample_masked_ref_is_the_cpu_masked_sampler() {
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for _ in 0..300 {
        let n = [1, 7, 300, 1000][rng.gen_range(0..4)];
        let mut logits = sampling_logits(&mut rng, n);
        let mut s = random_state(&mut rng);
        s.step_hi = 0;
        s.step_lo %= 8;
        let Some(words) = random_mask(&mut rng, &mut logits) else {
            continue;
        };
        let mask = octoflow_core::TokenMask::from_words(words.clone(), n);
        let want = cpu_sampler(&s, s.step())
            .sample_masked(&logits, &mask)
            .unwrap_or(0);
        assert_eq!(
            sample_masked_ref(&logits, &s, Some(&words)),
            want,
            "{s:?}, seed {seed}"
        );
    }
}

#[test]
fn gpu_masked_sample_draws_only_allowed_tokens() {
    let Some(ctx) = gpu_or_skip("gpu_masked_sample") else {
        return;
    };
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let sample = Sample::new(&ctx).unwrap();
    for &(n, n_rows) in &[(7usize, 12usize), (1000, 24), (49152, 10)] {
        let mut logits: Vec<Vec<f32>> = (0..n_rows).map(|_| sampling_logits(&mut rng, n)).collect();
        let masks: Vec<Option<Vec<u32>>> = logits
            .iter_mut()
            .map(|l| random_mask(&mut rng, l))
            .collect();
        let states: Vec<SamplerState> = (0..n_rows).map(|_| random_state(&mut rng)).collect();
        let words = mask_row_words(n as u32) as usize;
        let mut mask_buf = vec![0u32; words * n_rows];
        for (r, m) in masks.iter().enumerate() {
            let row = &mut mask_buf[r * words..(r + 1) * words];
            match m {
                Some(bits) => {
                    row[0] = 1;
                    row[1..].copy_from_slice(bits);
                }
                // An unconstrained row's bits are garbage the kernel must not read.
                None => row[1..].iter_mut().for_each(|w| *w = rng.gen()),
            }
        }
        let upload = |name: &str, words: &[u32]| {
            let b =
                Buffer::new(&ctx, name, 4 * words.len() as u64, MemoryKind::DeviceLocal).unwrap();
            ctx.upload(&b, 0, words).unwrap();
            b
        };
        let flat: Vec<u32> = logits.concat().iter().map(|v| v.to_bits()).collect();
        let lb = upload("logits", &flat);
        let sw: Vec<u32> = states.iter().flat_map(|s| s.to_words()).collect();
        let sb = upload("states", &sw);
        let mb = upload("mask", &mask_buf);
        // Poisoned: tokens and log-probabilities start as NaN bits.
        let out = upload("out", &vec![0x7FC0_0000u32; 2 * n_rows]);
        let mut chain = Chain::new(&ctx).unwrap();
        sample
            .record_rows_masked(
                &mut chain,
                &lb.whole(),
                n as u32,
                n_rows as u32,
                &sb.whole(),
                &out.whole(),
                0,
                Some(n_rows as u32),
                &mb.whole(),
            )
            .unwrap();
        chain.run().unwrap();
        let mut got = vec![0u32; 2 * n_rows];
        ctx.download(&out, 0, &mut got).unwrap();
        for r in 0..n_rows {
            let (row, s, m) = (&logits[r], &states[r], masks[r].as_deref());
            let token = got[r];
            let want = sample_masked_ref(row, s, m);
            let allowed = |t: u32| {
                m.is_none_or(|w| {
                    w.get(t as usize / 32)
                        .is_some_and(|w| w >> (t % 32) & 1 == 1)
                })
            };
            let any_allowed = (0..n as u32).any(allowed);
            assert!(
                !any_allowed || allowed(token),
                "n {n} row {r}, seed {seed}: token {token} is masked out"
            );
            if token != want {
                let masked: Vec<f32> = row
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| if allowed(i as u32) { v } else { f32::NAN })
                    .collect();
                let d = boundary_distance(&masked, s);
                assert!(
                    s.temperature > 0.0 && d < BOUNDARY,
                    "n {n} row {r} ({s:?}, mask {}), seed {seed}: GPU {token} vs CPU {want}",
                    m.map_or("none".into(), |w| format!(
                        "{} allowed",
                        w.iter().map(|w| w.count_ones()).sum::<u32>()
                    ))
                );
            }
            // The log-probability is the model's, over every token.
            let lp_want = logprob_ref(row, token);
            let lp = f32::from_bits(got[n_rows + r]);
            if lp_want.is_finite() {
                let tol = 1e-4 * lp_want.abs().max(1.0);
                assert!(
                    (lp - lp_want).abs() <= tol,
                    "n {n} row {r}, seed {seed}: logprob {lp} vs {lp_want}"
                );
            }
        }
    }
    assert_no_validation_errors(&ctx);
}
