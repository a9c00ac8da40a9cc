//! Tests of the one-session loop on a tiny random model with the tiny tokenizer: the CPU
//! reference token by token, a stand-in device whose decode steps stop by their own rule, and
//! the GPU's multi-step chains (lavapipe in CI).

use std::sync::Arc;

use octoflow_core::SamplingParams;
use octoflow_gguf::value::Value;
use octoflow_gguf::GgufWriter;
use octoflow_model::gpu::GpuModel;
use octoflow_model::testing::{add_tiny_tokenizer, rng, tiny_writer, TinyShape, TINY};
use octoflow_model::{Logits, Model, ModelConfig, Result as ModelResult, Session, Steps};
use octoflow_vk::testing::gpu_or_skip;

use super::*;
use crate::shift::ContextShift;

const PROMPT: [u32; 4] = [1, 262, 264, 263];

/// A tiny llama with the tiny tokenizer (random weights drawn once per test).
fn tiny_file(test: &str) -> GgufWriter<'static> {
    let mut probe = GgufWriter::new();
    let n_vocab = add_tiny_tokenizer(&mut probe, None);
    let mut w = tiny_writer("llama", TinyShape { n_vocab, ..TINY }, &mut rng(test));
    add_tiny_tokenizer(&mut w, None);
    w
}

/// The model and its tokenizer, the end-of-sequence id moved to `eos` if given.
fn open(w: &mut GgufWriter<'static>, eos: Option<u32>) -> (Model, Tokenizer) {
    if let Some(id) = eos {
        w.set("tokenizer.ggml.eos_token_id", Value::U32(id));
    }
    let file = Arc::new(octoflow_model::testing::open(w).expect("tiny model parses"));
    let tokenizer = Tokenizer::from_gguf(&file).expect("tiny tokenizer");
    (Model::from_gguf(file).expect("tiny model binds"), tokenizer)
}

fn limits(max_tokens: Option<usize>, ignore_eos: bool) -> Limits {
    Limits {
        max_tokens,
        stops: Vec::new(),
        ignore_eos,
    }
}

/// Greedy generation of `PROMPT` in `session`: the tokens, the text and the stats.
fn run(session: &mut dyn Forward, tok: &Tokenizer, limits: &Limits) -> (Vec<u32>, String, Stats) {
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let mut out = Vec::new();
    let (tokens, stats) =
        generate(session, tok, &mut sampler, &PROMPT, limits, None, &mut out).expect("generates");
    (tokens, String::from_utf8_lossy(&out).into_owned(), stats)
}

/// Where a greedy run can be made to end by moving the end of generation: the first index
/// whose token did not occur before it, with no special token (ids below 5) up to it; 0 if
/// none (a random model may repeat one token).
fn fresh_index(tokens: &[u32]) -> usize {
    (1..tokens.len())
        .take_while(|&i| tokens[..=i].iter().all(|&t| t >= 5))
        .find(|&i| !tokens[..i].contains(&tokens[i]))
        .unwrap_or(0)
}

/// A CPU session standing in for a device: it samples greedy draws itself, `burst` tokens per
/// call, and stops with `reason` once it has made `stop_after` tokens, a limit the CPU does
/// not know (as a device's end-of-generation list or context may be its own).
struct Device<'m> {
    cpu: Session<'m>,
    burst: usize,
    stop_after: usize,
    reason: Finish,
    made: usize,
}

impl Forward for Device<'_> {
    fn config(&self) -> &ModelConfig {
        self.cpu.config()
    }
    fn n_past(&self) -> usize {
        self.cpu.n_past()
    }
    fn n_ctx(&self) -> usize {
        self.cpu.n_ctx()
    }
    fn truncate(&mut self, len: usize) {
        self.cpu.truncate(len);
    }
    fn forward(&mut self, tokens: &[u32], start: usize, logits: Logits) -> ModelResult<Vec<f32>> {
        self.cpu.forward(tokens, start, logits)
    }
    fn device_samples(&self, draw: &Draw) -> bool {
        draw.is_greedy()
    }
    fn decode_steps(
        &mut self,
        mut token: u32,
        draw: &Draw,
        max_tokens: usize,
        eog: &[u32],
    ) -> ModelResult<Steps> {
        let mut tokens = Vec::new();
        while tokens.len() < self.burst.min(max_tokens) {
            token = draw.sample_cpu(&self.cpu.decode(token)?);
            tokens.push(token);
            self.made += 1;
            let stop = if eog.contains(&token) {
                Some(Finish::Eog)
            } else {
                (self.made >= self.stop_after).then_some(self.reason)
            };
            if stop.is_some() {
                return Ok(Steps { tokens, stop });
            }
        }
        let stop = (tokens.len() == max_tokens).then_some(Finish::Length);
        Ok(Steps { tokens, stop })
    }
}

#[test]
fn the_cpu_loop_stops_at_the_limit_and_at_a_full_context() {
    let (model, tok) = open(&mut tiny_file("the_cpu_loop_stops"), None);
    let (tokens, _, stats) = run(&mut model.session(64), &tok, &limits(Some(5), true));
    assert_eq!((tokens.len(), stats.finish), (5, Finish::Length));
    assert_eq!(stats.prompt_tokens, PROMPT.len());
    // 4 prompt positions of 8: tokens are fed at 4..=6, the one fed at 7 would bring none.
    let (tokens, _, stats) = run(&mut model.session(8), &tok, &limits(None, true));
    assert_eq!((tokens.len(), stats.finish), (4, Finish::Context));
    let mut full = model.session(4);
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let err = generate(
        &mut full,
        &tok,
        &mut sampler,
        &PROMPT,
        &limits(None, true),
        None,
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("context holds 4"), "{err}");
}

#[test]
fn an_end_of_generation_token_ends_it_on_the_cpu_and_on_the_device() {
    let mut w = tiny_file("an_end_of_generation_token_ends_it");
    let (model, tok) = open(&mut w, None);
    let (free, _, _) = run(&mut model.session(64), &tok, &limits(Some(12), true));
    let at = fresh_index(&free);
    let (model, tok) = open(&mut w, Some(free[at]));
    let (tokens, text, stats) = run(&mut model.session(64), &tok, &limits(Some(12), false));
    assert_eq!(
        (tokens.as_slice(), stats.finish),
        (&free[..=at], Finish::Eog)
    );
    let mut device = Device {
        cpu: model.session(64),
        burst: 3,
        stop_after: usize::MAX,
        reason: Finish::Context,
        made: 0,
    };
    let on_device = run(&mut device, &tok, &limits(Some(12), false));
    assert_eq!((on_device.0, on_device.1), (tokens, text));
    assert_eq!(on_device.2.finish, Finish::Eog);
}

#[test]
fn the_devices_own_stop_is_the_finish_when_the_cpu_found_none() {
    let (model, tok) = open(&mut tiny_file("the_devices_own_stop_is_the_finish"), None);
    let (want, want_text, _) = run(&mut model.session(64), &tok, &limits(Some(6), true));
    for reason in [Finish::Context, Finish::Length, Finish::Eog] {
        let mut device = Device {
            cpu: model.session(64),
            burst: 2,
            stop_after: 5,
            reason,
            made: 0,
        };
        let (tokens, text, stats) = run(&mut device, &tok, &limits(None, true));
        // The first token comes from the prompt's logits, five from the device.
        assert_eq!(tokens, want, "{reason:?}");
        assert_eq!(stats.finish, reason);
        assert_eq!(text, want_text, "the held text is released");
        assert_eq!(device.n_past(), PROMPT.len() + 5);
    }
}

#[test]
fn the_gpu_chains_stop_for_the_limit_the_context_and_end_of_generation() {
    let Some(ctx) = gpu_or_skip("the_gpu_chains_stop") else {
        return;
    };
    let mut w = tiny_file("the_gpu_chains_stop");
    let (model, tok) = open(&mut w, None);
    let gpu = GpuModel::load(&ctx, &model).expect("tiny model on the GPU");
    let (free, _, stats) = run(
        &mut gpu.session(64, 4).expect("session"),
        &tok,
        &limits(Some(10), true),
    );
    assert_eq!((free.len(), stats.finish), (10, Finish::Length));
    let (tokens, _, stats) = run(
        &mut gpu.session(8, 4).expect("session"),
        &tok,
        &limits(None, true),
    );
    assert_eq!((tokens.len(), stats.finish), (4, Finish::Context));
    let at = fresh_index(&free);
    let (model, tok) = open(&mut w, Some(free[at]));
    let gpu = GpuModel::load(&ctx, &model).expect("tiny model on the GPU");
    let (tokens, _, stats) = run(
        &mut gpu.session(64, 4).expect("session"),
        &tok,
        &limits(Some(10), false),
    );
    assert_eq!(
        (tokens.as_slice(), stats.finish),
        (&free[..=at], Finish::Eog)
    );
}

/// Checks greedy `tokens` generated after `prompt` in a context shifted with `keep` tokens
/// kept: each must be what `fresh`, emptied and fed all the held tokens at once, ranks first
/// (within a rounding-sized margin: the generation fed them in other batch shapes), the held
/// tokens shifted by the same rule (the first `keep`, then the newer half of the rest) before a
/// token that would not fit is fed. Returns the number of shifts.
fn check_shifted(
    fresh: &mut dyn Forward,
    prompt: &[u32],
    keep: usize,
    tokens: &[u32],
    label: &str,
) -> usize {
    let n_ctx = fresh.n_ctx();
    let rule = ContextShift::new(keep);
    let mut held = rule.fit(prompt, n_ctx, 1);
    let mut shifts = usize::from(held.len() < prompt.len());
    for (i, &t) in tokens.iter().enumerate() {
        fresh.truncate(0);
        let logits = fresh
            .forward(&held, 0, Logits::Last)
            .expect("reference forward");
        let (best, scale) = logits.iter().fold((f32::MIN, 0f32), |(b, m), &x| {
            assert!(x.is_finite(), "{label}: logit {x}");
            (b.max(x), m.max(x.abs()))
        });
        assert!(
            logits[t as usize] >= best - 1e-4 * scale.max(1.0),
            "{label}: token {i} is {t} ({}), the reference's best is {best}",
            logits[t as usize]
        );
        if i + 1 == tokens.len() {
            break;
        }
        if held.len() + 1 > n_ctx {
            held = rule.fit(&held, n_ctx, 1);
            shifts += 1;
        }
        held.push(t);
    }
    shifts
}

#[test]
fn a_shifting_context_goes_on_as_a_fresh_session_fed_the_kept_tokens_would() {
    let (model, tok) = open(&mut tiny_file("a_shifting_context_goes_on"), None);
    let gpu = gpu_or_skip("context shift on the GPU chains");
    let gpu_model = gpu
        .as_ref()
        .map(|ctx| GpuModel::load(ctx, &model).expect("tiny model on the GPU"));
    let (n_ctx, n) = (12, 30);
    // each backend against a fresh session of its own kind
    type Make<'a> = Box<dyn Fn() -> Box<dyn Forward + 'a> + 'a>;
    let mut backends: Vec<(&str, Make<'_>)> =
        vec![("CPU", Box::new(|| Box::new(model.session(n_ctx))))];
    if let Some(g) = gpu_model.as_ref() {
        backends.push((
            "GPU",
            Box::new(move || Box::new(g.session(n_ctx, 4).expect("session"))),
        ));
    }
    // a prompt that fits and one longer than the context, each generating past it twice
    let long: Vec<u32> = (0..20).map(|i| 5 + (i * 7) % 40).collect();
    for (prompt, keep) in [(&PROMPT[..], 1), (&long[..], 3)] {
        for (name, make) in &backends {
            let label = format!("{name}, prompt of {}", prompt.len());
            let mut session = make();
            let mut shift = ContextShift::new(keep);
            let mut sampler = Sampler::new(SamplingParams::greedy());
            let (tokens, stats) = generate(
                session.as_mut(),
                &tok,
                &mut sampler,
                prompt,
                &limits(Some(n), true),
                Some(&mut shift),
                &mut Vec::new(),
            )
            .expect("generates");
            assert_eq!((tokens.len(), stats.finish), (n, Finish::Length), "{label}");
            let shifts = check_shifted(make().as_mut(), prompt, keep, &tokens, &label);
            assert!(shifts >= 2, "{label}: {shifts} shifts");
            assert_eq!(stats.shifts, shifts, "{label}");
            assert_eq!(shift.held.len(), session.n_past(), "{label}");
            assert_eq!(
                shift.held[..keep],
                prompt[..keep],
                "{label}: the kept start"
            );
        }
    }
}
