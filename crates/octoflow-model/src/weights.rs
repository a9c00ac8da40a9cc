//! Model weights, named as the GGUF tensors they come from.
//!
//! Matrices stay in their file encoding (quantized, zero-copy views into the memory-mapped
//! file) and are multiplied with fused dequantize-and-dot kernels; norms, biases and other
//! vectors are dequantized to f32 once at load. Every shape is checked against the
//! hyper-parameters at load, so the forward pass can index without further checks.

use std::sync::Arc;

use octoflow_gguf::quant::{self, QuantError};
use octoflow_gguf::{GgmlType, GgufFile, TensorInfo};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::plan::{FfnPlan, MoePlan};

/// A weight matrix in its file encoding: `n_rows` rows of `n_cols` elements each.
///
/// GGUF dims are `[n_cols, n_rows]` (ggml order, `dims[0]` contiguous); row `r` occupies bytes
/// `[r * row_bytes, (r + 1) * row_bytes)` of [`QMatrix::data`]. A linear layer computes
/// `y[r] = dot(row r, x)`, so `n_cols` is the input width and `n_rows` the output width.
#[derive(Clone)]
pub struct QMatrix {
    /// GGUF tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    pub ty: GgmlType,
    pub n_rows: usize,
    pub n_cols: usize,
    row_bytes: usize,
    file: Arc<GgufFile>,
    /// Absolute byte offset of the data in the file.
    start: usize,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QMatrix({} {} [{}x{}])",
            self.name, self.ty, self.n_rows, self.n_cols
        )
    }
}

impl QMatrix {
    /// All rows' bytes, as stored in the file.
    pub fn data(&self) -> &[u8] {
        &self.file.bytes()[self.start..self.start + self.row_bytes * self.n_rows]
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The bytes of row `r` (`r < n_rows`).
    pub fn row(&self, r: usize) -> &[u8] {
        let at = self.start + r * self.row_bytes;
        &self.file.bytes()[at..at + self.row_bytes]
    }

    /// Dequantizes rows `[first, first + out.len() / n_cols)` into `out` (row-major).
    pub fn dequantize_rows(&self, first: usize, out: &mut [f32]) -> Result<()> {
        let n = out.len() / self.n_cols;
        let at = self.start + first * self.row_bytes;
        let bytes = &self.file.bytes()[at..at + n * self.row_bytes];
        quant::dequantize(self.ty, bytes, out).map_err(|e| self.quant_error(e))
    }

    /// Rows `[first, first + n_rows)` as a matrix of their own, named `name` (a view into the
    /// same file bytes: how fused matrices such as phi3's `attn_qkv` become `attn_q`, ...).
    pub(crate) fn rows(&self, name: String, first: usize, n_rows: usize) -> Result<QMatrix> {
        if first + n_rows > self.n_rows {
            return Err(ModelError::TensorShape {
                name: format!(
                    "{} (rows {first}..{} for {name})",
                    self.name,
                    first + n_rows
                ),
                expected: vec![self.n_cols as u64, (first + n_rows) as u64],
                found: vec![self.n_cols as u64, self.n_rows as u64],
            });
        }
        Ok(QMatrix {
            name,
            n_rows,
            start: self.start + first * self.row_bytes,
            file: Arc::clone(&self.file),
            ..*self
        })
    }

    pub(crate) fn quant_error(&self, source: QuantError) -> ModelError {
        ModelError::Quant {
            name: self.name.clone(),
            source,
        }
    }
}

/// The weights of one transformer block (`blk.N.*`).
#[derive(Debug, Clone)]
pub struct BlockWeights {
    /// `[n_embd]`
    pub attn_norm: Vec<f32>,
    /// `[q_dim rows, n_embd cols]`
    pub attn_q: QMatrix,
    /// `[k_dim rows, n_embd cols]`
    pub attn_k: QMatrix,
    /// `[v_dim rows, n_embd cols]`
    pub attn_v: QMatrix,
    /// `attn_q.bias`, `[q_dim]` (qwen2)
    pub attn_q_bias: Option<Vec<f32>>,
    /// `attn_k.bias`, `[k_dim]` (qwen2)
    pub attn_k_bias: Option<Vec<f32>>,
    /// `attn_v.bias`, `[v_dim]` (qwen2)
    pub attn_v_bias: Option<Vec<f32>>,
    /// Per-head norm of Q, `[head_dim]` (gemma3)
    pub attn_q_norm: Option<Vec<f32>>,
    /// Per-head norm of K, `[head_dim]` (gemma3)
    pub attn_k_norm: Option<Vec<f32>>,
    /// `[n_embd rows, n_head * head_dim_v cols]`
    pub attn_output: QMatrix,
    /// `attn_output.bias`, `[n_embd]` (gpt-oss)
    pub attn_output_bias: Option<Vec<f32>>,
    /// `attn_sinks.weight`, `[n_head]`: per-head sink logits (gpt-oss)
    pub attn_sinks: Option<Vec<f32>>,
    /// Norm of the attention output before the residual add, `[n_embd]` (gemma3)
    pub post_attention_norm: Option<Vec<f32>>,
    /// `[n_embd]`
    pub ffn_norm: Vec<f32>,
    /// The feed-forward's matrices, as the plan's kind.
    pub ffn: FfnWeights,
    /// Norm of the FFN output before the residual add, `[n_embd]` (gemma3)
    pub post_ffw_norm: Option<Vec<f32>>,
}

impl BlockWeights {
    /// The gated feed-forward's matrices, for paths that run only that kind.
    pub fn glu(&self) -> Result<&GluWeights> {
        match &self.ffn {
            FfnWeights::Glu(g) => Ok(g),
            FfnWeights::Moe(_) => Err(ModelError::Unsupported(
                "this path does not run a mixture-of-experts feed-forward yet".into(),
            )),
        }
    }
}

/// A block's feed-forward matrices.
#[derive(Debug, Clone)]
pub enum FfnWeights {
    Glu(GluWeights),
    Moe(MoeWeights),
}

/// A gated feed-forward (`ffn_gate`, `ffn_up`, `ffn_down`).
#[derive(Debug, Clone)]
pub struct GluWeights {
    /// `[n_ff rows, n_embd cols]`
    pub ffn_gate: QMatrix,
    /// `[n_ff rows, n_embd cols]`
    pub ffn_up: QMatrix,
    /// `[n_embd rows, n_ff cols]`
    pub ffn_down: QMatrix,
}

/// A mixture of experts: the router and every expert's matrices stacked expert after expert
/// (GGUF's 3-D `*_exps` tensors, `[n_cols, rows per expert, n_expert]`).
#[derive(Debug, Clone)]
pub struct MoeWeights {
    /// `ffn_gate_inp`, `[n_expert rows, n_embd cols]`
    pub router: QMatrix,
    /// `[n_expert]` (gpt-oss)
    pub router_bias: Option<Vec<f32>>,
    /// `ffn_gate_exps`, `[n_expert * n_ff rows, n_embd cols]`
    pub gate: QMatrix,
    /// `ffn_up_exps`, `[n_expert * n_ff rows, n_embd cols]`
    pub up: QMatrix,
    /// `ffn_down_exps`, `[n_expert * n_embd rows, n_ff cols]`
    pub down: QMatrix,
    /// `[n_expert * n_ff]`, `[n_expert * n_ff]`, `[n_expert * n_embd]` (gpt-oss)
    pub gate_bias: Option<Vec<f32>>,
    pub up_bias: Option<Vec<f32>>,
    pub down_bias: Option<Vec<f32>>,
}

/// All weights of a model.
#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// `[n_vocab rows, n_embd cols]`
    pub token_embd: QMatrix,
    /// `[n_embd]`
    pub output_norm: Vec<f32>,
    /// `[n_vocab rows, n_embd cols]`; a clone of `token_embd` when the file has no `output`.
    pub output: QMatrix,
    /// Whether `output` is `token_embd` (tied embeddings).
    pub output_is_tied: bool,
    /// Per-frequency divisors of the RoPE angles, `[n_rot / 2]` (`rope_freqs.weight`, llama 3).
    pub rope_freqs: Option<Vec<f32>>,
    /// LongRoPE's divisors for runs longer than the original context and for the others
    /// (`rope_factors_long.weight`, `rope_factors_short.weight`, `[n_rot / 2]`; phi3's 128k files).
    pub rope_long: Option<Vec<f32>>,
    pub rope_short: Option<Vec<f32>>,
    /// `blk.0` .. `blk.{n_layer-1}`
    pub blk: Vec<BlockWeights>,
}

impl ModelWeights {
    /// Binds every tensor of `file` that `config` calls for, checking names, shapes and types.
    pub fn from_gguf(file: &Arc<GgufFile>, config: &ModelConfig) -> Result<Self> {
        let ld = Loader {
            file,
            arch: config.arch.name(),
        };
        let (n_embd, n_vocab) = (config.n_embd, config.n_vocab);
        let token_embd = ld.matrix("token_embd.weight", n_vocab, n_embd)?;
        let (output, output_is_tied) = match file.tensor("output.weight") {
            Some(_) => (ld.matrix("output.weight", n_vocab, n_embd)?, false),
            None => (token_embd.clone(), true),
        };
        let factors = |name: &str| match file.tensor(name) {
            Some(_) => ld.vector(name, config.n_rot / 2).map(Some),
            None => Ok(None),
        };
        let rope_freqs = factors("rope_freqs.weight")?;
        let rope_long = factors("rope_factors_long.weight")?;
        let rope_short = factors("rope_factors_short.weight")?;
        let blk = (0..config.n_layer)
            .map(|il| ld.block(il, config))
            .collect::<Result<_>>()?;
        Ok(Self {
            token_embd,
            output_norm: ld.vector("output_norm.weight", n_embd)?,
            output,
            output_is_tied,
            rope_freqs,
            rope_long,
            rope_short,
            blk,
        })
    }

    /// The RoPE divisors of a run with an `n_ctx`-position context, as llama.cpp picks them:
    /// `rope_freqs` where the file has it, else LongRoPE's long factors when the context is
    /// longer than `n_ctx_orig` and the short ones otherwise (none where the file has none).
    pub fn rope_factors(&self, n_ctx: usize, n_ctx_orig: usize) -> Option<&[f32]> {
        let longrope = match n_ctx > n_ctx_orig {
            true => &self.rope_long,
            false => &self.rope_short,
        };
        self.rope_freqs.as_deref().or(longrope.as_deref())
    }
}

/// Finds tensors by name and checks them against the shapes the config implies.
struct Loader<'a> {
    file: &'a Arc<GgufFile>,
    arch: &'static str,
}

impl Loader<'_> {
    fn block(&self, il: usize, c: &ModelConfig) -> Result<BlockWeights> {
        let name = |t: &str| format!("blk.{il}.{t}");
        let m = |t: &str, rows, cols| self.matrix(&name(t), rows, cols);
        let v = |t: &str, n| self.vector(&name(t), n);
        let (attn, ffn) = (&c.blocks[il].attn, &c.blocks[il].ffn);
        let ffn_post_norm = match ffn {
            FfnPlan::Glu(g) => g.post_norm,
            FfnPlan::Moe(_) => false,
        };
        // Biases are loaded wherever present (llama.cpp does the same for llama), but required
        // only where the plan has them.
        let bias = |t: &str, n| -> Result<Option<Vec<f32>>> {
            match self.file.tensor(&name(t)) {
                Some(_) => v(t, n).map(Some),
                None if attn.qkv_bias => Err(self.missing(&name(t))),
                None => Ok(None),
            }
        };
        let when = |on: bool, t: &str, n| if on { v(t, n).map(Some) } else { Ok(None) };
        let attn_out_cols = c.n_head * c.head_dim_v;
        let (attn_q, attn_k, attn_v) = self.qkv(il, c)?;
        let ffn_weights = match ffn {
            FfnPlan::Glu(_) => {
                let (ffn_gate, ffn_up) = self.gate_up(il, c)?;
                FfnWeights::Glu(GluWeights {
                    ffn_gate,
                    ffn_up,
                    ffn_down: m("ffn_down.weight", c.n_embd, c.n_ff)?,
                })
            }
            FfnPlan::Moe(p) => FfnWeights::Moe(self.experts(il, c, p)?),
        };
        // gpt-oss names the feed-forward's pre-norm `post_attention_norm` (llama.cpp's
        // `attn_post_norm`, applied to the residual stream, not to the attention output)
        let ffn_norm = if c.arch == crate::arch::Architecture::GptOss {
            "post_attention_norm.weight"
        } else {
            "ffn_norm.weight"
        };
        Ok(BlockWeights {
            attn_norm: v("attn_norm.weight", c.n_embd)?,
            attn_q,
            attn_k,
            attn_v,
            attn_q_bias: bias("attn_q.bias", c.q_dim())?,
            attn_k_bias: bias("attn_k.bias", c.k_dim())?,
            attn_v_bias: bias("attn_v.bias", c.v_dim())?,
            attn_q_norm: when(attn.qk_norm, "attn_q_norm.weight", c.head_dim)?,
            attn_k_norm: when(attn.qk_norm, "attn_k_norm.weight", c.head_dim)?,
            attn_output: m("attn_output.weight", c.n_embd, attn_out_cols)?,
            attn_output_bias: when(attn.out_bias, "attn_output.bias", c.n_embd)?,
            attn_sinks: when(attn.sinks, "attn_sinks.weight", c.n_head)?,
            post_attention_norm: when(attn.post_norm, "post_attention_norm.weight", c.n_embd)?,
            ffn_norm: v(ffn_norm, c.n_embd)?,
            ffn: ffn_weights,
            post_ffw_norm: when(ffn_post_norm, "post_ffw_norm.weight", c.n_embd)?,
        })
    }

    /// Q, K and V: separate matrices, or row views of a fused `attn_qkv` (phi3) — Q's rows,
    /// then K's, then V's, as llama.cpp's `build_qkv` splits it.
    fn qkv(&self, il: usize, c: &ModelConfig) -> Result<(QMatrix, QMatrix, QMatrix)> {
        let name = |t: &str| format!("blk.{il}.{t}");
        let fused = name("attn_qkv.weight");
        if self.file.tensor(&fused).is_none() {
            return Ok((
                self.matrix(&name("attn_q.weight"), c.q_dim(), c.n_embd)?,
                self.matrix(&name("attn_k.weight"), c.k_dim(), c.n_embd)?,
                self.matrix(&name("attn_v.weight"), c.v_dim(), c.n_embd)?,
            ));
        }
        let (q, k, v) = (c.q_dim(), c.k_dim(), c.v_dim());
        let all = self.matrix(&fused, q + k + v, c.n_embd)?;
        Ok((
            all.rows(name("attn_q.weight"), 0, q)?,
            all.rows(name("attn_k.weight"), q, k)?,
            all.rows(name("attn_v.weight"), q + k, v)?,
        ))
    }

    /// The gate and up projections: separate matrices, or the two halves of phi3's fused
    /// `ffn_up` (`2 * n_ff` rows, gate first, as llama.cpp's `LLM_FFN_SWIGLU` splits it).
    fn gate_up(&self, il: usize, c: &ModelConfig) -> Result<(QMatrix, QMatrix)> {
        let name = |t: &str| format!("blk.{il}.{t}");
        if c.arch != crate::arch::Architecture::Phi3 {
            return Ok((
                self.matrix(&name("ffn_gate.weight"), c.n_ff, c.n_embd)?,
                self.matrix(&name("ffn_up.weight"), c.n_ff, c.n_embd)?,
            ));
        }
        let both = self.matrix(&name("ffn_up.weight"), 2 * c.n_ff, c.n_embd)?;
        Ok((
            both.rows(name("ffn_gate.weight"), 0, c.n_ff)?,
            both.rows(name("ffn_up.weight"), c.n_ff, c.n_ff)?,
        ))
    }

    /// A mixture of experts' router and stacked expert matrices (and their biases where the
    /// plan has them).
    fn experts(&self, il: usize, c: &ModelConfig, p: &MoePlan) -> Result<MoeWeights> {
        let name = |t: &str| format!("blk.{il}.{t}");
        let (e, f, d) = (p.n_expert, p.n_ff, c.n_embd);
        let bias = |t: &str, dims: &[u64]| -> Result<Option<Vec<f32>>> {
            if !p.biases {
                return Ok(None);
            }
            let n = dims.iter().product::<u64>() as usize;
            self.values(&name(t), dims, n).map(Some)
        };
        Ok(MoeWeights {
            router: self.matrix(&name("ffn_gate_inp.weight"), e, d)?,
            router_bias: bias("ffn_gate_inp.bias", &[e as u64])?,
            gate: self.stacked(&name("ffn_gate_exps.weight"), e, f, d)?,
            up: self.stacked(&name("ffn_up_exps.weight"), e, f, d)?,
            down: self.stacked(&name("ffn_down_exps.weight"), e, d, f)?,
            gate_bias: bias("ffn_gate_exps.bias", &[f as u64, e as u64])?,
            up_bias: bias("ffn_up_exps.bias", &[f as u64, e as u64])?,
            down_bias: bias("ffn_down_exps.bias", &[d as u64, e as u64])?,
        })
    }

    /// A 3-D `[n_cols, rows, n_expert]` tensor as one matrix of `n_expert * rows` rows.
    fn stacked(&self, name: &str, n_expert: usize, rows: usize, n_cols: usize) -> Result<QMatrix> {
        let dims = [n_cols as u64, rows as u64, n_expert as u64];
        let info = self.find(name, &dims)?;
        self.bind_matrix(name, info, n_expert * rows, n_cols, &dims)
    }

    fn find(&self, name: &str, expected: &[u64]) -> Result<&TensorInfo> {
        let info = self.file.tensor(name).ok_or_else(|| self.missing(name))?;
        if info.dims != expected {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: expected.to_vec(),
                found: info.dims.clone(),
            });
        }
        if !quant::can_dequantize(info.ty) {
            return Err(ModelError::UnsupportedTensorType {
                name: name.to_string(),
                ty: info.ty,
            });
        }
        Ok(info)
    }

    fn matrix(&self, name: &str, n_rows: usize, n_cols: usize) -> Result<QMatrix> {
        let dims = [n_cols as u64, n_rows as u64];
        let info = self.find(name, &dims)?;
        self.bind_matrix(name, info, n_rows, n_cols, &dims)
    }

    fn bind_matrix(
        &self,
        name: &str,
        info: &TensorInfo,
        n_rows: usize,
        n_cols: usize,
        dims: &[u64],
    ) -> Result<QMatrix> {
        let row_bytes =
            quant::quantized_size(info.ty, n_cols).map_err(|source| ModelError::Quant {
                name: name.to_string(),
                source,
            })?;
        if info.size != (row_bytes * n_rows) as u64 {
            return Err(ModelError::TensorShape {
                name: format!(
                    "{name} (data is {} bytes, expected {})",
                    info.size,
                    row_bytes * n_rows
                ),
                expected: dims.to_vec(),
                found: info.dims.clone(),
            });
        }
        Ok(QMatrix {
            name: name.to_string(),
            ty: info.ty,
            n_rows,
            n_cols,
            row_bytes,
            file: Arc::clone(self.file),
            start: (self.file.header().data_offset + info.offset) as usize,
        })
    }

    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>> {
        self.values(name, &[n as u64], n)
    }

    /// A tensor of shape `dims` (`n` elements) dequantized to f32.
    fn values(&self, name: &str, dims: &[u64], n: usize) -> Result<Vec<f32>> {
        let info = self.find(name, dims)?;
        let mut out = vec![0f32; n];
        quant::dequantize(info.ty, self.file.tensor_data(info), &mut out).map_err(|source| {
            ModelError::Quant {
                name: name.to_string(),
                source,
            }
        })?;
        Ok(out)
    }

    fn missing(&self, name: &str) -> ModelError {
        ModelError::MissingTensor {
            name: name.to_string(),
            arch: self.arch,
        }
    }
}
