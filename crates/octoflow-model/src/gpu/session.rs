//! The GPU forward path: [`GpuModel`] (weights and pipelines on one device) and [`GpuSession`]
//! (one sequence: its KV cache, scratch buffers and recorded chains).
//!
//! Chains are recorded once per shape and replayed: a batch chain per (tokens, logits kind),
//! and a multi-step decode chain per (steps, greedy) in which each step's sampled token feeds
//! the next step's embedding on the GPU and a stop flag gates the remaining steps to no-ops.

use std::collections::HashMap;

use octoflow_core::{Draw, Finish};
use octoflow_kernels::advance::ctl;
use octoflow_kernels::{KvType, Positions, Sample, SamplerState};
use octoflow_vk::{gate_words, summarize, Chain, Context, LabelTime};

use crate::adapter::Adapter;
use crate::backend::{check_batch, Forward, Steps};
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::forward::Logits;
use crate::gpu::adapters::{GpuAdapters, MixSource};
use crate::gpu::graph::{Graph, GraphLora, PosSource, TokenSource};
use crate::gpu::kernels::Kernels;
use crate::gpu::scratch::{Scratch, SESSION_LOGIT_ROWS};
use crate::gpu::weights::GpuWeights;
use crate::model::Model;

/// Tokens per batch chain (prompt chunks, llama.cpp's default ubatch); longer batches run as
/// several submits. The prefill products cost nearly the same per dispatch for 256 or 512
/// tokens on an H100 (the coopmat kernel's per-dispatch floor), so bigger chunks pay.
pub const BATCH_TOKENS: u32 = 512;

/// A model loaded on a Vulkan device.
pub struct GpuModel {
    pub config: ModelConfig,
    pub(crate) ctx: Context,
    pub(crate) weights: GpuWeights,
    pub(crate) kernels: Kernels,
    pub(crate) adapters: Option<GpuAdapters>,
    /// What the KV caches of new sessions and batches hold.
    pub(crate) kv_type: KvType,
}

impl GpuModel {
    /// Uploads `model`'s weights to `ctx`'s device and builds the pipelines.
    pub fn load(ctx: &Context, model: &Model) -> Result<Self> {
        let c = &model.config;
        if !c.n_embd.is_multiple_of(4) {
            return Err(ModelError::Gpu(format!(
                "n_embd = {} is not a multiple of 4, which the GPU path needs to bind single rows",
                c.n_embd
            )));
        }
        Ok(Self {
            config: c.clone(),
            // weights first: a weight type the kernels do not read fails before any pipeline
            // is built
            weights: GpuWeights::upload(ctx, model)?,
            kernels: Kernels::new(ctx)?,
            ctx: ctx.clone(),
            adapters: None,
            // the library's default is the reference's own precision; the binary's
            // `--cache-type` defaults to f16
            kv_type: KvType::F32,
        })
    }

    /// Replaces the product kernels (tests of a tuning's paths, built with
    /// [`octoflow_kernels::Linear::with_tuning`]); sessions made before keep theirs.
    pub fn with_linear(mut self, linear: octoflow_kernels::Linear) -> Self {
        self.kernels.linear = linear;
        self
    }

    /// Replaces the expert-product kernels (tests of their paths:
    /// [`octoflow_kernels::MoeExperts::with_dot`], `with_dot_groups`); as [`GpuModel::with_linear`].
    pub fn with_moe_experts(mut self, experts: octoflow_kernels::MoeExperts) -> Self {
        self.kernels.moe.experts = experts;
        self
    }

    /// [`GpuModel::load`] with the GPU kernels even on a CPU driver (tests of the GPU-only paths
    /// on lavapipe: norms fused into the projections).
    #[cfg(test)]
    pub(crate) fn load_gpu_layout(ctx: &Context, model: &Model) -> Result<Self> {
        let mut m = Self::load(ctx, model)?;
        m.kernels.linear = octoflow_kernels::Linear::with_gpu_layout(ctx)?;
        Ok(m)
    }

    /// Applies `adapters` at user `scales` (one each) on the fly in every session and batch made
    /// from now on (llama.cpp's `--lora-scaled`): a session uses all of them together, a batch
    /// row the one it names ([`crate::BatchRow::adapter`]). Replaces any adapters set before.
    pub fn set_adapters(&mut self, adapters: &[Adapter], scales: &[f32]) -> Result<()> {
        self.adapters = None;
        self.adapters = Some(GpuAdapters::upload(
            &self.ctx,
            &self.config,
            adapters,
            scales,
        )?);
        Ok(())
    }

    /// The adapters applied, if any.
    pub fn adapters(&self) -> Option<&GpuAdapters> {
        self.adapters.as_ref()
    }

    /// The adapters applied, to change their scales (no session may exist).
    pub fn adapters_mut(&mut self) -> Option<&mut GpuAdapters> {
        self.adapters.as_mut()
    }

    /// The stacked rank sessions must make room for.
    pub(crate) fn lora_r(&self) -> u32 {
        self.adapters.as_ref().map_or(0, |a| a.r_max)
    }

    /// The adapters as a chain applies them, each token reading its mix from `mix`.
    pub(crate) fn graph_lora(
        &self,
        mix: impl FnOnce(&GpuAdapters) -> MixSource,
    ) -> Option<GraphLora<'_>> {
        self.adapters
            .as_ref()
            .map(|ad| GraphLora { ad, mix: mix(ad) })
    }
    /// The uploaded weights (read by other chains over the same copy, e.g. the trainer's).
    pub fn weights(&self) -> &GpuWeights {
        &self.weights
    }

    /// The model's pipelines.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// The device.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Device bytes held by the weights.
    /// Sessions and batches made from now on keep their KV caches in `kv`; an error where the
    /// device cannot hold such caches.
    pub fn set_kv_type(&mut self, kv: KvType) -> Result<()> {
        if !kv.supported(self.ctx.caps()) {
            return Err(ModelError::Gpu(format!(
                "{} has no 16-bit storage buffers, which an {kv} KV cache needs (use f32)",
                self.ctx.caps().name
            )));
        }
        kv.check_heads(self.config.head_dim, self.config.head_dim_v)
            .map_err(ModelError::Gpu)?;
        self.kv_type = kv;
        Ok(())
    }

    /// What the KV caches of new sessions and batches hold.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes
    }

    /// A new sequence of at most `n_ctx` positions that decodes up to `steps_per_submit` tokens
    /// per submit.
    pub fn session(&self, n_ctx: usize, steps_per_submit: usize) -> Result<GpuSession<'_>> {
        let n_ctx = u32::try_from(n_ctx)
            .map_err(|_| ModelError::Gpu(format!("context size {n_ctx} is too large")))?;
        let t_max = BATCH_TOKENS.min(n_ctx.max(1));
        let steps = steps_per_submit.clamp(1, 1024) as u32;
        Ok(GpuSession {
            model: self,
            s: Scratch::new(
                &self.ctx,
                &self.config,
                n_ctx,
                t_max,
                SESSION_LOGIT_ROWS,
                steps,
                self.lora_r(),
                self.kv_type,
            )?,
            n_past: 0,
            batch_chains: HashMap::new(),
            step_chains: HashMap::new(),
            profile: false,
            gated: false,
            last_profile: None,
        })
    }
}

/// One sequence on the GPU.
pub struct GpuSession<'m> {
    model: &'m GpuModel,
    s: Scratch,
    n_past: usize,
    batch_chains: HashMap<(u32, u8), Chain>,
    step_chains: HashMap<(u32, bool), Chain>,
    profile: bool,
    gated: bool,
    last_profile: Option<Vec<LabelTime>>,
}

/// Key of the output-rows chains in the batch-chain cache (next to [`logits_key`]'s).
const OUTPUT_ROWS_KEY: u8 = 3;

fn logits_key(l: Logits) -> u8 {
    match l {
        Logits::None => 0,
        Logits::Last => 1,
        Logits::All => 2,
    }
}

impl GpuSession<'_> {
    /// Records chains with GPU timestamps from now on; [`Self::profile`] then reports the last
    /// decode submit's time per kernel.
    pub fn set_profiling(&mut self, on: bool) -> Result<()> {
        if on && !self.model.ctx.caps().timestamps {
            return Err(ModelError::Gpu(format!(
                "{} has no compute timestamps; --profile is unavailable",
                self.model.ctx.caps().name
            )));
        }
        if on != self.profile {
            self.batch_chains.clear();
            self.step_chains.clear();
        }
        self.profile = on;
        Ok(())
    }

    /// Whether decode steps after a stop are skipped on the GPU (gated: every dispatch of a step
    /// is indirect, its workgroup count zeroed once `ctl.STOP` is set) or run to no effect
    /// (ungated: direct dispatches; after a stop `advance` records nothing and the position no
    /// longer moves, so the extra steps only rewrite the cache row past the sequence's end).
    /// Default: ungated (on the H100 ~4% faster; a stop wastes at most the submit's other steps).
    pub fn set_gated(&mut self, on: bool) {
        if on != self.gated {
            self.step_chains.clear();
        }
        self.gated = on;
    }

    /// GPU time per kernel of the last profiled submit (a batch or a run of decode steps).
    pub fn profile(&self) -> Option<&[LabelTime]> {
        self.last_profile.as_deref()
    }

    /// Device bytes of this session's buffers (KV cache, activations, logits).
    pub fn bytes(&self) -> u64 {
        self.s.bytes()
    }

    fn graph(&self) -> Graph<'_> {
        Graph {
            k: &self.model.kernels,
            c: &self.model.config,
            w: &self.model.weights,
            s: &self.s,
            pos: PosSource {
                buf: self.s.ctl.whole(),
                offset: ctl::POS,
                mode: Positions::Run,
                seq_rows: self.s.n_ctx,
            },
            lora: self.model.graph_lora(|ad| MixSource {
                ids: ad.all_slice(),
                offset: 0,
                stride: 0,
            }),
            // one sequence: its steps of several rows are prompt chunks
            decode: false,
        }
    }

    fn new_chain(&self) -> Result<Chain> {
        let ctx = &self.model.ctx;
        Ok(if self.profile {
            Chain::with_profiling(ctx)?
        } else {
            Chain::new(ctx)?
        })
    }

    /// Runs the batch chain for `n` tokens (ids already in the scratch list, `ctl::POS` set).
    fn run_batch(&mut self, n: u32, logits: Logits) -> Result<()> {
        self.run_cached((n, logits_key(logits)), |g, chain| {
            g.forward(chain, n, &TokenSource::Ids, logits)
        })
    }

    /// Runs the final norm and output projection of the `n_out` rows of the last batch whose
    /// indices are in the scratch id list, into the logits buffer.
    fn run_output(&mut self, n_out: u32) -> Result<()> {
        let rows = self.s.ids.slice(0, 4 * u64::from(n_out))?;
        self.run_cached((n_out, OUTPUT_ROWS_KEY), |g, chain| {
            g.output_rows(chain, n_out, &rows)
        })
    }

    /// Runs the batch chain cached under `key`, recording it with `record` first if needed.
    fn run_cached(
        &mut self,
        key: (u32, u8),
        record: impl FnOnce(&Graph<'_>, &mut Chain) -> Result<()>,
    ) -> Result<()> {
        self.record_cached(key, record)?;
        let chain = self
            .batch_chains
            .get_mut(&key)
            .ok_or_else(|| ModelError::Gpu("batch chain vanished".into()))?;
        chain.run()?;
        if self.profile {
            self.last_profile = chain.timings()?.map(|t| summarize(&t));
        }
        Ok(())
    }

    /// Records the batch chain of `key` with `record` unless it is cached; whether it recorded.
    fn record_cached(
        &mut self,
        key: (u32, u8),
        record: impl FnOnce(&Graph<'_>, &mut Chain) -> Result<()>,
    ) -> Result<bool> {
        if self.batch_chains.contains_key(&key) {
            return Ok(false);
        }
        // Shapes change with every prompt length: keep a few recent recordings only.
        if self.batch_chains.len() >= 8 {
            self.batch_chains.clear();
        }
        let mut chain = self.new_chain()?;
        record(&self.graph(), &mut chain)?;
        chain.finish()?;
        self.batch_chains.insert(key, chain);
        Ok(true)
    }

    /// Records one decode step (gate, forward of the control token, sampling, advance). With
    /// `gated`, the step's dispatches form a gated span (returned: their workgroup counts),
    /// preceded by the gate kernel when a `template` is given (without one: a probe recording).
    fn record_step(
        &self,
        chain: &mut Chain,
        greedy: bool,
        gated: bool,
        template: Option<(&octoflow_vk::Buffer, u32)>,
    ) -> Result<Vec<[u32; 3]>> {
        let (k, s, c) = (&self.model.kernels, &self.s, &self.model.config);
        let ctl_block = s.ctl.whole();
        if let Some((t, n_words)) = template {
            k.gate.record(
                chain,
                &ctl_block,
                ctl::STOP,
                &t.whole(),
                &s.args.whole(),
                n_words,
            )?;
            chain.barrier()?;
        }
        if gated {
            chain.gate_begin(&s.args)?;
        }
        self.graph()
            .forward(chain, 1, &TokenSource::Control, Logits::Last)?;
        let logits = s.logits.slice(0, 4 * c.n_vocab as u64)?;
        if greedy {
            k.argmax
                .record(chain, &logits, c.n_vocab as u32, &ctl_block, ctl::TOKEN)?;
        } else {
            k.sample.record(
                chain,
                &logits,
                c.n_vocab as u32,
                &s.sampler.whole(),
                &ctl_block,
                ctl::TOKEN,
            )?;
        }
        chain.compute_barrier()?;
        k.advance
            .record(chain, &ctl_block, &s.out_tokens.whole(), s.out_len, 1)?;
        let groups = if gated { chain.gate_end()? } else { Vec::new() };
        chain.barrier()?;
        Ok(groups)
    }

    /// Records the chain of `steps` decode steps.
    fn record_steps(&self, steps: u32, greedy: bool) -> Result<Chain> {
        if !self.gated {
            let mut chain = self.new_chain()?;
            for _ in 0..steps {
                self.record_step(&mut chain, greedy, false, None)?;
            }
            chain.finish()?;
            return Ok(chain);
        }
        // A throwaway recording of one step yields the gate template: the workgroup counts of
        // every gated dispatch (identical for every step).
        let mut probe = Chain::new(&self.model.ctx)?;
        let template = self.record_step(&mut probe, greedy, true, None)?;
        drop(probe);
        let words = gate_words(&template);
        let t = octoflow_vk::Buffer::new(
            &self.model.ctx,
            "gate_template",
            4 * words.len().max(1) as u64,
            octoflow_vk::MemoryKind::DeviceLocal,
        )?;
        self.model.ctx.upload(&t, 0, &words)?;
        let mut chain = self.new_chain()?;
        for _ in 0..steps {
            let g = self.record_step(&mut chain, greedy, true, Some((&t, words.len() as u32)))?;
            if g != template {
                return Err(ModelError::Gpu(
                    "decode steps recorded different dispatches".into(),
                ));
            }
        }
        chain.finish()?;
        Ok(chain)
    }

    /// Feeds `token` at the next position and runs up to `steps_per_submit` decode steps on the
    /// GPU in one submit, each sampling the next token with `draw` and feeding it to the next
    /// step. Stops early at a token of `eog` (the first 8 are checked on the GPU), after
    /// `max_tokens` tokens, or when the context is full. `draw.step` must be the draw counter of
    /// the first step; it advances by one per returned token.
    pub fn decode_steps(
        &mut self,
        token: u32,
        draw: &Draw,
        max_tokens: usize,
        eog: &[u32],
    ) -> Result<Steps> {
        check_batch(
            &self.model.config,
            &[token],
            self.n_past,
            self.n_past,
            self.s.n_ctx as usize,
        )?;
        if !self.device_samples(draw) {
            return Err(ModelError::DeviceSampling(format!(
                "the GPU sampler does not handle temperature {} with top_k {}",
                draw.temperature, draw.top_k
            )));
        }
        let key = (self.s.out_len, draw.is_greedy());
        self.record_steps_cached(key)?;
        let mut block = [0u32; ctl::WORDS as usize];
        let n_eog = eog.len().min(ctl::MAX_EOG as usize);
        block[ctl::POS as usize] = self.n_past as u32;
        block[ctl::TOKEN as usize] = token;
        block[ctl::MAX_GEN as usize] = max_tokens.clamp(1, u32::MAX as usize) as u32;
        block[ctl::N_CTX as usize] = self.s.n_ctx;
        block[ctl::N_EOG as usize] = n_eog as u32;
        block[ctl::EOG as usize..ctl::EOG as usize + n_eog].copy_from_slice(&eog[..n_eog]);
        self.s.ctl.write(0, &block)?;
        self.s
            .sampler
            .write(0, &SamplerState::from_draw(draw).to_words())?;
        let chain = self
            .step_chains
            .get_mut(&key)
            .ok_or_else(|| ModelError::Gpu("decode chain vanished".into()))?;
        chain.run()?;
        if self.profile {
            self.last_profile = chain.timings()?.map(|t| summarize(&t));
        }
        self.s.ctl.read(0, &mut block)?;
        let n_out = (block[ctl::N_OUT as usize]).min(self.s.out_len) as usize;
        let mut tokens = vec![0u32; n_out];
        self.s.out_tokens.read(0, &mut tokens)?;
        // Every step that ran fed one token: the input token, then all outputs but the last.
        self.n_past += n_out;
        let stop = match block[ctl::STOP as usize] {
            ctl::STOP_EOG => Some(Finish::Eog),
            ctl::STOP_LENGTH => Some(Finish::Length),
            ctl::STOP_CONTEXT => Some(Finish::Context),
            _ => None,
        };
        Ok(Steps { tokens, stop })
    }

    /// Builds, before the first prompt, the pipelines and the chains a generation replays: the
    /// batch chain of a prompt of `prompt_len` tokens (or of its first chunk: longer prompts run
    /// in chunks of the same pipelines) and the decode chain for draws like `draw` on the GPU
    /// (`None`: the CPU samples, one token per batch chain with the last row's logits). A chat
    /// that does not know its first prompt yet passes `usize::MAX`: a whole chunk, whose
    /// pipelines every prompt of more than a few tokens shares. Returns the number of chains
    /// recorded.
    pub fn warm_up(&mut self, draw: Option<&Draw>, prompt_len: usize) -> Result<usize> {
        let chunk = u32::try_from(prompt_len).map_or(self.s.t_max, |n| n.clamp(1, self.s.t_max));
        let prompt = self.warm_batch(chunk)?;
        let decode = match draw {
            Some(d) => self.record_steps_cached((self.s.out_len, d.is_greedy()))?,
            None => self.warm_batch(1)?,
        };
        Ok(usize::from(prompt) + usize::from(decode))
    }

    /// Records the decode chain of `key` (steps, greedy) unless it is cached; whether it recorded.
    fn record_steps_cached(&mut self, key: (u32, bool)) -> Result<bool> {
        if self.step_chains.contains_key(&key) {
            return Ok(false);
        }
        let chain = self.record_steps(key.0, key.1)?;
        self.step_chains.insert(key, chain);
        Ok(true)
    }

    /// Records the batch chain of `n` tokens with the last row's logits, if not yet recorded.
    fn warm_batch(&mut self, n: u32) -> Result<bool> {
        self.record_cached((n, logits_key(Logits::Last)), |g, chain| {
            g.forward(chain, n, &TokenSource::Ids, Logits::Last)
        })
    }

    /// Decode steps per submit.
    pub fn steps_per_submit(&self) -> usize {
        self.s.out_len as usize
    }
}

impl Forward for GpuSession<'_> {
    fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    fn n_past(&self) -> usize {
        self.n_past
    }

    fn n_ctx(&self) -> usize {
        self.s.n_ctx as usize
    }

    fn truncate(&mut self, len: usize) {
        self.n_past = self.n_past.min(len);
    }

    fn device_samples(&self, draw: &Draw) -> bool {
        Sample::supports(draw.temperature, draw.top_k)
    }

    fn decode_steps(
        &mut self,
        token: u32,
        draw: &Draw,
        max_tokens: usize,
        eog: &[u32],
    ) -> Result<Steps> {
        GpuSession::decode_steps(self, token, draw, max_tokens, eog)
    }

    fn forward(&mut self, tokens: &[u32], start_pos: usize, logits: Logits) -> Result<Vec<f32>> {
        check_batch(
            &self.model.config,
            tokens,
            start_pos,
            self.n_past,
            self.s.n_ctx as usize,
        )?;
        let n_vocab = self.model.config.n_vocab;
        let cap = self.s.t_max as usize;
        let n_chunks = tokens.len().div_ceil(cap);
        let mut out = Vec::new();
        for (i, part) in tokens.chunks(cap).enumerate() {
            // every row's logits: the layers over the whole chunk, then the output projection
            // in pieces of the logits buffer's rows (a few: it is the largest scratch buffer)
            let want = match logits {
                Logits::Last if i + 1 < n_chunks => Logits::None,
                Logits::All => Logits::None,
                l => l,
            };
            let pos = (start_pos + i * cap) as u32;
            self.s.ids.write(0, part)?;
            self.s.ctl.write(4 * u64::from(ctl::POS), &[pos])?;
            self.run_batch(part.len() as u32, want)?;
            if want == Logits::Last {
                let at = out.len();
                out.resize(at + n_vocab, 0f32);
                self.model.ctx.download(&self.s.logits, 0, &mut out[at..])?;
            }
            if logits == Logits::All {
                let n = part.len() as u32;
                for first in (0..n).step_by(self.s.t_logits as usize) {
                    let n_out = self.s.t_logits.min(n - first);
                    let rows: Vec<u32> = (first..first + n_out).collect();
                    self.s.ids.write(0, &rows)?;
                    self.run_output(n_out)?;
                    let at = out.len();
                    out.resize(at + n_out as usize * n_vocab, 0f32);
                    self.model.ctx.download(&self.s.logits, 0, &mut out[at..])?;
                }
            }
            self.n_past = start_pos + (i * cap) + part.len();
        }
        Ok(out)
    }
}
