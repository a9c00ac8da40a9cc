//! The VM on a real (tiny, random) model through `CpuBatch`, against plain host-driven
//! generation written out with one `Session` per sequence: bit-identical tokens.

use std::collections::BTreeMap;

use octoflow_agents::{assemble, Event, Pattern, Run, RunConfig};
use octoflow_core::Draw;
use octoflow_model::testing::{rng, tiny_model, TINY};
use octoflow_model::{ops, CpuBatch, Forward, Logits, Model, Session};
use rand::Rng;

const N_CTX: usize = 512;
/// The tiny model's vocabulary is 50 ids; id 2 plays the end-of-generation token.
const EOG: u32 = 2;

/// A byte per id, folded into the tiny vocabulary.
fn tokenize(s: &str) -> Vec<u32> {
    s.bytes().map(|b| b as u32 % TINY.n_vocab as u32).collect()
}

/// Outputs by (task, round, instance).
type Outputs = BTreeMap<(u32, u32, u32), Vec<u32>>;

/// Runs `pattern` on `model`; returns its outputs and whether the engine sampled.
fn run_vm(model: &Model, pattern: Pattern, cfg: RunConfig, tasks: &[Vec<u32>]) -> (Outputs, bool) {
    let mut engine = CpuBatch::new(model, cfg.instances, N_CTX, 256);
    let program = assemble(pattern.source(), &tokenize).expect("assembles");
    let mut run = Run::new(program, cfg, tasks.to_vec(), &engine).expect("starts");
    let mut out = BTreeMap::new();
    while !run.finished() {
        run.step(&mut engine).expect("step");
        for e in run.events() {
            match e {
                Event::Output {
                    instance,
                    task,
                    round,
                    tokens,
                    ..
                } => {
                    let task = task.expect("a task");
                    assert!(out.insert((task, round, instance), tokens).is_none());
                }
                Event::Error { message, .. } => panic!("{message}"),
            }
        }
    }
    (out, run.samples_on_device())
}

fn random_tasks(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|_| {
            let len = rng.gen_range(2..=9);
            (0..len)
                .map(|_| rng.gen_range(3..TINY.n_vocab as u32))
                .collect()
        })
        .collect()
}

/// Where `tokens` ends with the stop sequence, its length.
fn stop_match(tokens: &[u32], stop: &[u32]) -> Option<usize> {
    tokens.ends_with(stop).then_some(stop.len())
}

#[test]
fn queue_answers_equal_plain_greedy_generation() {
    let mut rng = rng("queue_tiny");
    let model = tiny_model("llama", TINY, &mut rng);
    let tasks = random_tasks(&mut rng, 7);
    let max = 12;
    let cfg = RunConfig {
        instances: 3,
        max_tokens: max as u32,
        temperature: 0.0,
        eog: vec![EOG],
        ..RunConfig::default()
    };
    let (vm, _) = run_vm(&model, Pattern::Queue, cfg, &tasks);
    let stop = tokenize("END_ACTION");
    for (t, task) in tasks.iter().enumerate() {
        // Prefill the prompt, then decode greedily token by token.
        let mut session = model.session(N_CTX);
        let mut logits = session.prefill(task, 256).expect("prefill");
        let mut out = Vec::new();
        let kept = loop {
            let (id, _) = ops::argmax(&logits).expect("logits");
            out.push(id as u32);
            if id as u32 == EOG {
                break out[..out.len() - 1].to_vec();
            }
            if let Some(n) = stop_match(&out, &stop) {
                break out[..out.len() - n].to_vec();
            }
            if out.len() == max {
                break out;
            }
            logits = session.decode(id as u32).expect("decode");
        };
        let key = vm
            .keys()
            .find(|k| k.0 == t as u32)
            .copied()
            .expect("an output for the task");
        assert_eq!(vm[&key], kept, "task {t}");
    }
    assert_eq!(vm.len(), tasks.len());
}

/// One debater of the host-driven reference: a session, the pending token, the logits an
/// append left, and its draws.
struct Debater<'m> {
    session: Session<'m>,
    pending: Option<u32>,
    logits: Option<Vec<f32>>,
    seed: u64,
    draws: u64,
}

impl Debater<'_> {
    /// Feeds the pending token and `tokens` in one forward pass.
    fn append(&mut self, tokens: &[u32]) {
        let mut feed: Vec<u32> = self.pending.take().into_iter().collect();
        feed.extend_from_slice(tokens);
        self.logits = None;
        if !feed.is_empty() {
            let pos = self.session.n_past();
            let l = self
                .session
                .forward(&feed, pos, Logits::Last)
                .expect("append");
            self.logits = Some(l);
        }
    }

    /// Generates up to `max` tokens from the append's logits; returns the kept tokens.
    fn gen(&mut self, cfg: &RunConfig, max: usize, stop: &[u32]) -> Vec<u32> {
        let mut logits = self.logits.take().expect("gen right after an append");
        let mut out = Vec::new();
        loop {
            let draw = Draw {
                temperature: cfg.temperature,
                top_k: cfg.top_k,
                top_p: cfg.top_p,
                min_p: cfg.min_p,
                seed: self.seed,
                step: self.draws,
            };
            let t = draw.sample_cpu(&logits);
            self.draws += 1;
            out.push(t);
            self.pending = Some(t);
            if t == EOG {
                return out[..out.len() - 1].to_vec();
            }
            if let Some(n) = stop_match(&out, stop) {
                return out[..out.len() - n].to_vec();
            }
            if out.len() == max {
                return out;
            }
            self.pending = None;
            logits = self.session.decode(t).expect("decode");
        }
    }
}

/// The debate pattern written out: per task, every debater answers; then for each further
/// round reads the others' previous answers and revises.
fn debate_reference(model: &Model, cfg: &RunConfig, tasks: &[Vec<u32>]) -> Outputs {
    let n = cfg.instances;
    let stop = tokenize("END_ACTION");
    let other = tokenize("\n\nAnother agent answered: ");
    let revise = tokenize(
        "\n\nUsing the other answers as additional information, give your updated answer.",
    );
    let max = cfg.max_tokens as usize;
    let mut debaters: Vec<Debater> = (0..n)
        .map(|_| Debater {
            session: model.session(N_CTX),
            pending: None,
            logits: None,
            seed: 0,
            draws: 0,
        })
        .collect();
    let mut out = BTreeMap::new();
    for (k, task) in tasks.iter().enumerate() {
        let mut answers = Vec::new();
        for (i, d) in debaters.iter_mut().enumerate() {
            d.session.truncate(0);
            d.pending = None;
            d.seed = cfg.seed + (k * n + i) as u64;
            d.draws = 0;
            d.append(task);
            answers.push(d.gen(cfg, max, &stop));
        }
        for round in 0..cfg.rounds {
            for (i, a) in answers.iter().enumerate() {
                out.insert((k as u32, round, i as u32), a.clone());
            }
            if round + 1 == cfg.rounds {
                break;
            }
            let mut next = Vec::new();
            for (i, d) in debaters.iter_mut().enumerate() {
                for (j, a) in answers.iter().enumerate() {
                    if j != i {
                        d.append(&other);
                        d.append(a);
                    }
                }
                d.append(&revise);
                next.push(d.gen(cfg, max, &stop));
            }
            answers = next;
        }
    }
    out
}

#[test]
fn debate_equals_a_host_driven_reimplementation() {
    let mut rng = rng("debate_tiny");
    let model = tiny_model("llama", TINY, &mut rng);
    let tasks = random_tasks(&mut rng, 2);
    for (instances, temperature) in [(2, 0.0), (3, 0.0), (3, 0.9)] {
        let cfg = RunConfig {
            instances,
            max_tokens: 8,
            rounds: 2,
            seed: 77,
            temperature,
            eog: vec![EOG],
            ..RunConfig::default()
        };
        let (vm, _) = run_vm(&model, Pattern::Debate, cfg.clone(), &tasks);
        let reference = debate_reference(&model, &cfg, &tasks);
        assert_eq!(vm.len(), tasks.len() * instances * 2);
        assert_eq!(vm, reference, "n={instances} temperature={temperature}");
    }
}

#[test]
fn sampling_on_the_device_gives_the_hosts_tokens() {
    let mut rng = rng("device_tiny");
    let model = tiny_model("llama", TINY, &mut rng);
    let tasks = random_tasks(&mut rng, 5);
    for temperature in [0.0, 0.8] {
        let cfg = RunConfig {
            instances: 2,
            max_tokens: 10,
            seed: 5,
            temperature,
            top_k: 40,
            eog: vec![EOG],
            ..RunConfig::default()
        };
        let (host, on_device) = run_vm(&model, Pattern::Queue, cfg.clone(), &tasks);
        assert!(!on_device);
        let device_cfg = RunConfig {
            device_sampling: true,
            ..cfg
        };
        let (device, on_device) = run_vm(&model, Pattern::Queue, device_cfg, &tasks);
        assert!(on_device, "CpuBatch samples top-k 40 on its 'device'");
        // Which instance took a task may differ; the task's tokens may not.
        let by_task = |m: &Outputs| {
            m.iter()
                .map(|(k, v)| (k.0, v.clone()))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            by_task(&host),
            by_task(&device),
            "temperature {temperature}"
        );
    }
}

#[test]
fn best_of_samples_on_the_device_with_the_hosts_scores() {
    let mut rng = rng("best_of_tiny");
    let model = tiny_model("llama", TINY, &mut rng);
    let tasks = random_tasks(&mut rng, 2);
    for temperature in [0.0, 0.8] {
        let cfg = RunConfig {
            instances: 3,
            max_tokens: 4,
            temperature,
            top_k: 40,
            eog: vec![EOG],
            ..RunConfig::default()
        };
        let (host, on_device) = run_vm(&model, Pattern::BestOf, cfg.clone(), &tasks);
        assert!(!on_device);
        let device_cfg = RunConfig {
            device_sampling: true,
            ..cfg
        };
        // CpuBatch's sampled rows carry octoflow-core's `logprob`, the host's own function:
        // the same scores bit for bit, so `best` picks the same winners.
        let (device, on_device) = run_vm(&model, Pattern::BestOf, device_cfg, &tasks);
        assert!(on_device, "best reads scores the engine's sampler gives");
        assert_eq!(host.len(), 2);
        assert_eq!(host, device, "temperature {temperature}");
    }
}
