//! A session's device buffers: the control block, token ids, activations for up to `t_max`
//! tokens, logits, the KV cache and the decode chain's bookkeeping.

use octoflow_kernels::advance::ctl;
use octoflow_kernels::linear::MATVEC_MAX_TOKENS;
use octoflow_kernels::KvType;
use octoflow_vk::{Buffer, Context, MemoryKind};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::plan::FfnPlan;

/// Slots of indirect-dispatch arguments a gated decode step may use (a step of a 30-layer model
/// records about 600 dispatches).
pub const MAX_GATED_DISPATCHES: u64 = 8192;

/// Words of the sampler state (`octoflow_kernels::SamplerState`).
pub const SAMPLER_WORDS: u64 = 8;
/// Most rows of logits a session computes at once (all of a chunk's logits, for perplexity,
/// come back in pieces of this many rows after the layers ran over the whole chunk):
/// `rows × n_vocab` f32 is the largest scratch buffer (qwen2.5: 4.9 MB for 8 rows, 311 MB for a
/// whole 512-token chunk). Each piece reads the output matrix once more: a few milliseconds per
/// 512-token chunk on the H100 against tens of megabytes of device memory.
pub const SESSION_LOGIT_ROWS: u32 = 8;

/// Buffers of one session. Activations are f32 row-major, one row per token.
pub struct Scratch {
    /// Most tokens per batch.
    pub t_max: u32,
    /// Most tokens per batch whose logits are all kept (`[t_logits, n_vocab]` fits one binding).
    pub t_logits: u32,
    /// Positions the KV cache holds.
    pub n_ctx: u32,
    /// Capacity of `out_tokens`: decode steps per submit.
    pub out_len: u32,
    /// `[t_max]` u32 token ids, host-written.
    pub ids: Buffer,
    /// The control block (`octoflow_kernels::advance::ctl`), host-written and host-read.
    pub ctl: Buffer,
    /// `[t_max, n_embd]`: the residual stream.
    pub x: Buffer,
    /// `[t_max, n_embd]`: normed activations.
    pub h: Buffer,
    /// `[t_max, n_head * head_dim]`
    pub q: Buffer,
    /// `[t_max, n_head_kv * head_dim]`
    pub k: Buffer,
    /// `[t_max, n_head_kv * head_dim_v]`
    pub v: Buffer,
    /// `[t_max, n_head * head_dim_v]`: attention output.
    pub att: Buffer,
    /// `[t_max, n_embd]`: a block's output before its post-norm.
    pub o: Buffer,
    /// `[t_max, n_ff]`
    pub ffn_gate: Buffer,
    /// `[t_max, n_ff]`
    pub ffn_up: Buffer,
    /// `[t_logits, n_vocab]`
    pub logits: Buffer,
    /// Per layer: keys `[n_ctx, n_head_kv * head_dim]` and values `[n_ctx, n_head_kv * head_dim_v]`
    /// of `kv_type`.
    pub kv: Vec<(Buffer, Buffer)>,
    /// What the KV caches hold.
    pub kv_type: KvType,
    /// The sampler's state, host-written.
    pub sampler: Buffer,
    /// `[out_len]` u32: tokens sampled by the decode steps of one submit.
    pub out_tokens: Buffer,
    /// Indirect-dispatch arguments of a gated decode step.
    pub args: Buffer,
    /// With adapters: three parts of [`Self::lora_part`] bytes, each `[t_max, r_max]` f32, for
    /// the adapters' intermediate products of up to three projections at once.
    pub lora_t: Option<Buffer>,
    /// Bytes per part of `lora_t` (aligned for a binding offset).
    pub lora_part: u64,
    /// A mixture-of-experts model's routing and expert buffers.
    pub moe: Option<MoeScratch>,
}

/// The buffers of a mixture-of-experts feed-forward over `t_max` tokens of `n_used` experts
/// each (`pairs = t_max * n_used`).
pub struct MoeScratch {
    /// `[t_max, n_expert]` f32: router logits.
    pub logits: Buffer,
    /// `[pairs]` u32: each pair's expert.
    pub ids: Buffer,
    /// `[pairs]` f32: each pair's weight.
    pub weights: Buffer,
    /// `[n_expert + 1]` u32 and `[pairs]` u32: the pairs grouped by expert (batches).
    pub offsets: Buffer,
    pub list: Buffer,
    /// `[pairs, n_ff]` f32: the experts' activations.
    pub act: Buffer,
    /// `[pairs, n_embd]` f32: the experts' outputs.
    pub y: Buffer,
    /// The normed stream quantized per block of 32 by the fused router for the experts' GLU
    /// (`octoflow_kernels::q8_words(min(t_max, MATVEC_MAX_TOKENS), n_embd)` words: only steps
    /// whose experts take the pairs one by one use it).
    pub xq: Buffer,
}

impl MoeScratch {
    fn buffers(&self) -> [&Buffer; 8] {
        [
            &self.logits,
            &self.ids,
            &self.weights,
            &self.offsets,
            &self.list,
            &self.act,
            &self.y,
            &self.xq,
        ]
    }
}

impl Scratch {
    /// Allocates a session's buffers: batches of up to `t_max` tokens with logits for up to
    /// `logit_rows` of them, `n_ctx` cached positions, `out_len` decode steps per submit, adapters
    /// of stacked rank up to `lora_r` (0: none), KV caches of `kv_type`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: &Context,
        c: &ModelConfig,
        n_ctx: u32,
        t_max: u32,
        logit_rows: u32,
        out_len: u32,
        lora_r: u32,
        kv_type: KvType,
    ) -> Result<Self> {
        let limit = ctx.caps().max_buffer_bytes();
        let t_logits =
            (limit / (4 * c.n_vocab as u64)).min(u64::from(t_max.min(logit_rows))) as u32;
        if t_logits == 0 {
            return Err(ModelError::Gpu(format!(
                "one row of {} logits does not fit in one binding ({limit} bytes) of {}",
                c.n_vocab,
                ctx.caps().name
            )));
        }
        let dev_bytes = |name: &str, bytes: u64| -> Result<Buffer> {
            if bytes > limit {
                return Err(ModelError::Gpu(format!(
                    "{name} needs {bytes} bytes, more than one binding of {} allows ({limit}); lower the context size",
                    ctx.caps().name
                )));
            }
            Ok(Buffer::new(
                ctx,
                name,
                bytes.max(4),
                MemoryKind::DeviceLocal,
            )?)
        };
        let dev = |name: &str, floats: usize| dev_bytes(name, 4 * floats as u64);
        let host = |name: &str, words: u64| Buffer::new(ctx, name, 4 * words, MemoryKind::Upload);
        let t = t_max as usize;
        let kv = (0..c.n_layer)
            .map(|il| {
                let cache = |name: String, width: usize| {
                    dev_bytes(&name, kv_type.bytes_for(u64::from(n_ctx) * width as u64))
                };
                Ok((
                    cache(format!("k_cache.{il}"), c.k_dim())?,
                    cache(format!("v_cache.{il}"), c.v_dim())?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let lora_part = (4 * u64::from(t_max) * u64::from(lora_r)).next_multiple_of(256);
        let lora_t = if lora_r > 0 {
            Some(Buffer::new(
                ctx,
                "lora_t",
                3 * lora_part,
                MemoryKind::DeviceLocal,
            )?)
        } else {
            None
        };
        // every MoE block of a model has the same shape (one arch file, one plan per layer kind);
        // the largest is taken all the same
        let moe = c
            .blocks
            .iter()
            .filter_map(|b| match &b.ffn {
                FfnPlan::Moe(m) => Some(m),
                FfnPlan::Glu(_) => None,
            })
            .max_by_key(|m| (m.n_used * m.n_ff.max(c.n_embd), m.n_expert));
        let moe = match moe {
            None => None,
            Some(m) => {
                let pairs = t * m.n_used;
                Some(MoeScratch {
                    logits: dev("moe_logits", t * m.n_expert)?,
                    ids: dev("moe_ids", pairs)?,
                    weights: dev("moe_weights", pairs)?,
                    offsets: dev("moe_offsets", m.n_expert + 1)?,
                    list: dev("moe_list", pairs)?,
                    act: dev("moe_act", pairs * m.n_ff)?,
                    y: dev("moe_y", pairs * c.n_embd)?,
                    xq: dev(
                        "moe_xq",
                        octoflow_kernels::q8_words(
                            t.min(MATVEC_MAX_TOKENS as usize) as u32,
                            c.n_embd as u32,
                        ) as usize,
                    )?,
                })
            }
        };
        Ok(Self {
            moe,
            lora_t,
            lora_part,
            t_max,
            t_logits,
            n_ctx,
            out_len,
            ids: host("ids", u64::from(t_max))?,
            ctl: host("ctl", u64::from(ctl::WORDS))?,
            x: dev("x", t * c.n_embd)?,
            h: dev("h", t * c.n_embd)?,
            q: dev("q", t * c.q_dim())?,
            k: dev("k", t * c.k_dim())?,
            v: dev("v", t * c.v_dim())?,
            att: dev("att", t * c.n_head * c.head_dim_v)?,
            o: dev("o", t * c.n_embd)?,
            ffn_gate: dev("ffn_gate", t * c.n_ff)?,
            ffn_up: dev("ffn_up", t * c.n_ff)?,
            logits: dev("logits", t_logits as usize * c.n_vocab)?,
            kv,
            kv_type,
            sampler: host("sampler", SAMPLER_WORDS)?,
            out_tokens: host("out_tokens", u64::from(out_len.max(1)))?,
            args: Buffer::new(
                ctx,
                "gate_args",
                12 * MAX_GATED_DISPATCHES,
                MemoryKind::DeviceLocal,
            )?,
        })
    }

    /// Device bytes these buffers occupy.
    pub fn bytes(&self) -> u64 {
        let mut all = vec![
            &self.ids,
            &self.ctl,
            &self.x,
            &self.h,
            &self.q,
            &self.k,
            &self.v,
            &self.att,
            &self.o,
            &self.ffn_gate,
            &self.ffn_up,
            &self.logits,
            &self.sampler,
            &self.out_tokens,
            &self.args,
        ];
        for (k, v) in &self.kv {
            all.push(k);
            all.push(v);
        }
        all.extend(&self.lora_t);
        if let Some(m) = &self.moe {
            all.extend(m.buffers());
        }
        all.iter().map(|b| b.size()).sum()
    }
}
