//! Hyper-parameters of a model, read from GGUF metadata (`{arch}.block_count`, ...).
//!
//! [`ModelConfig::from_gguf`] reads the keys every architecture shares, then hands them to the
//! architecture's own file (`arch/llama.rs`, ...), which describes its blocks ([`BlockPlan`]:
//! norms, biases, RoPE, attention kind, feed-forward) from them and its own keys.

use octoflow_gguf::GgufFile;

use crate::arch::{self, Architecture};
use crate::error::{ModelError, Result};
use crate::plan::{BlockPlan, RopePlan, Yarn};

/// How RoPE pairs the dimensions of a head (llama.cpp's `LLAMA_ROPE_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeType {
    /// Adjacent pairs `(2i, 2i+1)` rotate together (`LLAMA_ROPE_TYPE_NORM`: llama).
    Normal,
    /// Pairs `(i, i + n_rot/2)` rotate together (`LLAMA_ROPE_TYPE_NEOX`: qwen2, gemma3).
    Neox,
}

/// The gate activation of the gated feed-forward block: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)` (SwiGLU: llama, qwen2).
    Silu,
    /// GELU, tanh approximation (GeGLU: gemma3).
    GeluTanh,
}

/// Every hyper-parameter the forward pass uses.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    /// Vocabulary size (rows of `token_embd`).
    pub n_vocab: usize,
    /// Context length the model was trained for (`{arch}.context_length`).
    pub n_ctx_train: usize,
    /// The context RoPE's factors were made for (`rope.scaling.original_context_length`, else
    /// `n_ctx_train`): a run with a longer context takes LongRoPE's long factors.
    pub n_ctx_orig: usize,
    pub n_layer: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Width of the feed-forward hidden layer.
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    /// Width of one query/key head (`{arch}.attention.key_length`, default `n_embd / n_head`).
    pub head_dim: usize,
    /// Width of one value head (`{arch}.attention.value_length`, default `head_dim`).
    pub head_dim_v: usize,
    /// Epsilon of every RMSNorm.
    pub rms_eps: f32,
    /// Leading dimensions of each head that RoPE rotates (`{arch}.rope.dimension_count`).
    pub n_rot: usize,
    /// Factor applied to token embeddings before the first layer (gemma: `sqrt(n_embd)`).
    pub embedding_scale: f32,
    /// What each layer's block computes, one entry per layer.
    pub blocks: Vec<BlockPlan>,
}

impl ModelConfig {
    /// Reads every hyper-parameter from the metadata of `file`.
    ///
    /// Fails with a clear error for an unsupported `general.architecture`, a missing required
    /// key, or values the forward pass cannot use (say, heads that do not divide evenly).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let name = file.get_str("general.architecture")?;
        let arch =
            Architecture::from_name(name).ok_or_else(|| ModelError::UnsupportedArchitecture {
                found: name.to_string(),
                supported: Architecture::SUPPORTED,
            })?;
        let base = BaseHParams::read(&Meta { file, arch })?;
        let recipe = arch::configure(&Meta { file, arch }, &base)?;
        let config = Self::assemble(base, recipe);
        config.validate()?;
        Ok(config)
    }

    fn assemble(base: BaseHParams, recipe: Recipe) -> Self {
        Self {
            arch: base.arch,
            n_vocab: base.n_vocab,
            n_ctx_train: base.n_ctx_train,
            n_ctx_orig: base.n_ctx_orig,
            n_layer: base.n_layer,
            n_embd: base.n_embd,
            n_ff: base.n_ff,
            n_head: base.n_head,
            n_head_kv: base.n_head_kv,
            head_dim: base.head_dim,
            head_dim_v: base.head_dim_v,
            rms_eps: base.rms_eps,
            n_rot: base.n_rot,
            embedding_scale: recipe.embedding_scale,
            blocks: recipe.blocks,
        }
    }

    /// Number of query heads that share one KV head.
    pub fn gqa_group(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    /// Width of all query heads together (`n_head * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of all key heads together (`n_head_kv * head_dim`).
    pub fn k_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of all value heads together (`n_head_kv * head_dim_v`).
    pub fn v_dim(&self) -> usize {
        self.n_head_kv * self.head_dim_v
    }

    fn validate(&self) -> Result<()> {
        let key = |k: &str| format!("{}.{k}", self.arch.name());
        let bad = |k: &str, problem: String| ModelError::BadHyperParameter {
            key: key(k),
            problem,
        };
        for (k, v) in [
            ("block_count", self.n_layer),
            ("embedding_length", self.n_embd),
            ("feed_forward_length", self.n_ff),
            ("attention.head_count", self.n_head),
            ("attention.head_count_kv", self.n_head_kv),
            ("attention.key_length", self.head_dim),
            ("attention.value_length", self.head_dim_v),
        ] {
            if v == 0 {
                return Err(bad(k, "must be positive, found 0".into()));
            }
        }
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(bad(
                "attention.head_count_kv",
                format!(
                    "{} KV heads do not divide {} query heads",
                    self.n_head_kv, self.n_head
                ),
            ));
        }
        if !self.n_rot.is_multiple_of(2) || self.n_rot > self.head_dim {
            return Err(bad(
                "rope.dimension_count",
                format!(
                    "must be even and at most the head size {}, found {}",
                    self.head_dim, self.n_rot
                ),
            ));
        }
        // also refuses NaN
        if self.rms_eps.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return Err(bad(
                "attention.layer_norm_rms_epsilon",
                format!("must be positive, found {}", self.rms_eps),
            ));
        }
        Ok(())
    }
}

/// What an architecture adds to the shared hyper-parameters (see [`ModelConfig`] for the fields).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Recipe {
    pub embedding_scale: f32,
    pub blocks: Vec<BlockPlan>,
}

/// The hyper-parameters whose keys every supported architecture shares.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BaseHParams {
    pub arch: Architecture,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub rms_eps: f32,
    pub n_rot: usize,
    pub rope_base: f32,
    pub rope_scale: f32,
    /// YaRN terms when `rope.scaling.type` is `yarn`; without YaRN, an attention factor other
    /// than 1 (`rope.scaling.attn_factor`: LongRoPE's) as terms that only scale cos and sin.
    pub rope_yarn: Option<Yarn>,
    /// The context the RoPE factors were trained for (`rope.scaling.original_context_length`,
    /// else the training context): runs with a longer context take LongRoPE's long factors.
    pub n_ctx_orig: usize,
}

impl BaseHParams {
    fn read(m: &Meta) -> Result<Self> {
        let n_embd = m.req_usize("embedding_length")?;
        let n_head = m.req_usize("attention.head_count")?;
        if n_head == 0 {
            return Err(m.bad("attention.head_count", "must be positive, found 0"));
        }
        let head_dim = m
            .opt_usize("attention.key_length")?
            .unwrap_or(n_embd / n_head);
        // mixture-of-experts families size their experts with their own key; llama.cpp reads
        // `feed_forward_length` as optional there
        let n_ff = match m.opt_usize("feed_forward_length")? {
            Some(n) => n,
            None => m
                .opt_usize("expert_feed_forward_length")?
                .ok_or_else(|| m.bad("feed_forward_length", "missing"))?,
        };
        let n_ctx_train = m.req_usize("context_length")?;
        let n_rot = m.opt_usize("rope.dimension_count")?.unwrap_or(head_dim);
        let rope_base = m.opt_f32("rope.freq_base")?.unwrap_or(10_000.0);
        let rope_scale = read_rope_scale(m)?;
        let rope_yarn = read_yarn(m, n_rot, rope_base, rope_scale, n_ctx_train)?;
        let n_ctx_orig = m
            .opt_usize("rope.scaling.original_context_length")?
            .unwrap_or(n_ctx_train);
        Ok(Self {
            arch: m.arch,
            n_vocab: read_vocab_size(m)?,
            n_ctx_train,
            n_layer: m.req_usize("block_count")?,
            n_embd,
            n_ff,
            n_head,
            // Absent means multi-head attention (llama.cpp's default).
            n_head_kv: m.opt_usize("attention.head_count_kv")?.unwrap_or(n_head),
            head_dim,
            head_dim_v: m.opt_usize("attention.value_length")?.unwrap_or(head_dim),
            rms_eps: m.req_f32("attention.layer_norm_rms_epsilon")?,
            n_rot,
            rope_base,
            rope_scale,
            rope_yarn,
            n_ctx_orig,
        })
    }

    /// `1 / sqrt(head_dim)`: the usual scale of `q . k`.
    pub fn default_attention_scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// The model's RoPE (base and scale from the file) in the pairing `kind`.
    pub fn rope(&self, kind: RopeType) -> RopePlan {
        RopePlan {
            kind,
            base: self.rope_base,
            scale: self.rope_scale,
            yarn: self.rope_yarn,
        }
    }
}

/// `{arch}.vocab_size`, or else the length of `tokenizer.ggml.tokens`.
fn read_vocab_size(m: &Meta) -> Result<usize> {
    if let Some(n) = m.opt_usize("vocab_size")? {
        return Ok(n);
    }
    match m.file.get("tokenizer.ggml.tokens") {
        Some(v) => v
            .as_array()
            .map(<[_]>::len)
            .ok_or_else(|| ModelError::BadHyperParameter {
                key: "tokenizer.ggml.tokens".into(),
                problem: format!("expected an array, found {}", v.type_description()),
            }),
        None => Err(ModelError::BadHyperParameter {
            key: m.key("vocab_size"),
            problem: "missing, and so is tokenizer.ggml.tokens".into(),
        }),
    }
}

/// The RoPE position scale: `1 / factor` for linear and YaRN scaling, 1.0 for none.
///
/// Follows llama.cpp: the factor comes from `rope.scaling.factor`, or else the older
/// `rope.scale_linear`. Scaling types that change more than these (longrope, and YaRN with
/// DeepSeek's log multiplier) are refused rather than run wrongly.
fn read_rope_scale(m: &Meta) -> Result<f32> {
    if let Some(kind) = m.opt_str("rope.scaling.type")? {
        if !matches!(kind, "none" | "linear" | "yarn") {
            return Err(m.bad(
                "rope.scaling.type",
                &format!("{kind:?} is not supported (supported: none, linear, yarn)"),
            ));
        }
        if kind == "none" {
            return Ok(1.0);
        }
    }
    let factor = match m.opt_f32("rope.scaling.factor")? {
        Some(f) => Some(f),
        None => m.opt_f32("rope.scale_linear")?,
    };
    match factor {
        None => Ok(1.0),
        Some(0.0) => Ok(1.0),
        Some(f) if f > 0.0 => Ok(1.0 / f),
        Some(f) => Err(m.bad(
            "rope.scaling.factor",
            &format!("must be positive, found {f}"),
        )),
    }
}

/// YaRN's terms when `rope.scaling.type` is `yarn` (llama.cpp's defaults: `beta_fast` 32,
/// `beta_slow` 1, extrapolation factor 1; the context is `rope.scaling.original_context_length`,
/// else the training context).
fn read_yarn(
    m: &Meta,
    n_rot: usize,
    base: f32,
    scale: f32,
    n_ctx_train: usize,
) -> Result<Option<Yarn>> {
    let attn_factor = m.opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
    if !attn_factor.is_finite() || attn_factor <= 0.0 {
        return Err(m.bad(
            "rope.scaling.attn_factor",
            &format!("must be a positive number, found {attn_factor}"),
        ));
    }
    if m.opt_str("rope.scaling.type")? != Some("yarn") {
        // llama.cpp multiplies cos and sin by the attention factor whatever the scaling
        // (phi3's LongRoPE files carry one): YaRN terms without the blend do exactly that
        return Ok((attn_factor != 1.0).then_some(Yarn {
            ext_factor: 0.0,
            low: 0.0,
            high: 0.0,
            mscale: attn_factor,
        }));
    }
    if m.opt_f32("rope.scaling.yarn_log_multiplier")?
        .is_some_and(|v| v != 0.0)
    {
        return Err(m.bad(
            "rope.scaling.yarn_log_multiplier",
            "YaRN with a log multiplier (DeepSeek's) is not supported",
        ));
    }
    let n_ctx_orig = m
        .opt_usize("rope.scaling.original_context_length")?
        .unwrap_or(n_ctx_train);
    // transformers' `truncate: false` (GPT-OSS's config) keeps the correction dimensions
    // unrounded; llama.cpp always rounds them, and so does a file without the key
    let truncate = m.opt_bool("rope.scaling.yarn_truncate")?.unwrap_or(true);
    Ok(Some(Yarn::new(
        n_rot,
        base,
        1.0 / scale,
        n_ctx_orig,
        (32.0, 1.0),
        attn_factor,
        truncate,
    )))
}

/// Typed access to `{arch}.*` metadata keys: required keys fail when absent, optional keys only
/// when present with the wrong type.
pub(crate) struct Meta<'a> {
    pub file: &'a GgufFile,
    pub arch: Architecture,
}

impl Meta<'_> {
    /// The full key name, `{arch}.{suffix}`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch.name())
    }

    pub fn bad(&self, suffix: &str, problem: &str) -> ModelError {
        ModelError::BadHyperParameter {
            key: self.key(suffix),
            problem: problem.to_string(),
        }
    }

    pub fn req_usize(&self, suffix: &str) -> Result<usize> {
        let key = self.key(suffix);
        let v = self.file.get_u64(&key)?;
        usize::try_from(v).map_err(|_| self.bad(suffix, &format!("{v} does not fit in usize")))
    }

    pub fn opt_usize(&self, suffix: &str) -> Result<Option<usize>> {
        if self.file.get(&self.key(suffix)).is_none() {
            return Ok(None);
        }
        self.req_usize(suffix).map(Some)
    }

    pub fn req_f32(&self, suffix: &str) -> Result<f32> {
        Ok(self.file.get_f32(&self.key(suffix))?)
    }

    pub fn opt_f32(&self, suffix: &str) -> Result<Option<f32>> {
        if self.file.get(&self.key(suffix)).is_none() {
            return Ok(None);
        }
        self.req_f32(suffix).map(Some)
    }

    pub fn opt_bool(&self, suffix: &str) -> Result<Option<bool>> {
        match self.file.get(&self.key(suffix)) {
            None => Ok(None),
            Some(octoflow_gguf::Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.bad(suffix, "must be a boolean")),
        }
    }

    pub fn opt_str(&self, suffix: &str) -> Result<Option<&str>> {
        let key = self.key(suffix);
        if self.file.get(&key).is_none() {
            return Ok(None);
        }
        Ok(Some(self.file.get_str(&key)?))
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
