//! The frozen base for the CPU step: every matrix dequantized to f32 once (the step reads each
//! one two or three times per micro-batch; decoding the quantized blocks each time would cost
//! more than the products), the norms and biases as they are, and each layer's plan.

use rayon::prelude::*;

use octoflow_model::plan::planned;
use octoflow_model::{Activation, AttnPlan, Model, QMatrix};

use crate::error::{Result, TrainError};

/// Rows dequantized per task.
const ROWS_PER_TASK: usize = 64;

/// A row-major f32 matrix `[rows, cols]` (`y = W x` maps `cols` inputs to `rows` outputs).
pub(crate) struct Dense {
    pub rows: usize,
    pub cols: usize,
    pub w: Vec<f32>,
}

impl Dense {
    pub fn of(q: &QMatrix) -> Result<Self> {
        let mut w = vec![0f32; q.n_rows * q.n_cols];
        w.par_chunks_mut(ROWS_PER_TASK * q.n_cols)
            .enumerate()
            .try_for_each(|(i, out)| q.dequantize_rows(i * ROWS_PER_TASK, out))?;
        Ok(Dense {
            rows: q.n_rows,
            cols: q.n_cols,
            w,
        })
    }

    fn bytes(&self) -> u64 {
        4 * self.w.len() as u64
    }
}

/// One layer's weights and plan.
pub(crate) struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: Dense,
    pub k: Dense,
    pub v: Dense,
    pub bias: [Option<Vec<f32>>; 3],
    /// Per-head norms of q and k (qwen3, gemma3), where the plan has them.
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub o: Dense,
    pub post_attn: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub gate: Dense,
    pub up: Dense,
    pub down: Dense,
    pub post_ffw: Option<Vec<f32>>,
    pub act: Activation,
    pub attn: AttnPlan,
    /// RoPE's angle per rotated pair per position (radians), `rope_freqs` of the plan.
    pub freqs: Vec<f64>,
}

/// The whole frozen model.
pub(crate) struct Base {
    /// Looked up row by row (dequantized per id).
    pub token_embd: QMatrix,
    pub out_norm: Vec<f32>,
    pub output: Dense,
    pub layers: Vec<Layer>,
}

impl Base {
    /// Dequantizes `model`. Refuses what the training step does not run (as the GPU's does).
    pub fn new(model: &Model) -> Result<Self> {
        let c = &model.config;
        let w = &model.weights;
        // training sequences are shorter than the original context: LongRoPE's short factors
        let ff = w.rope_factors(1, c.n_ctx_orig);
        let layers = w
            .blk
            .iter()
            .zip(&c.blocks)
            .enumerate()
            .map(|(il, (b, plan))| -> Result<Layer> {
                if let Some(missing) = plan.train_missing() {
                    return Err(octoflow_model::ModelError::Unsupported(format!(
                        "{} has {missing}, which the training step does not run yet",
                        c.arch
                    ))
                    .into());
                }
                let (ap, glu, gw) = (&plan.attn, plan.glu()?, b.glu()?);
                let norm = |on, t: &Option<Vec<f32>>, name| -> Result<Option<Vec<f32>>> {
                    Ok(planned(il, on, t, name)?.cloned())
                };
                let qk_norm = match (
                    norm(ap.qk_norm, &b.attn_q_norm, "attn_q_norm")?,
                    norm(ap.qk_norm, &b.attn_k_norm, "attn_k_norm")?,
                ) {
                    (Some(q), Some(k)) => Some((q, k)),
                    _ => None,
                };
                Ok(Layer {
                    attn_norm: b.attn_norm.clone(),
                    q: Dense::of(&b.attn_q)?,
                    k: Dense::of(&b.attn_k)?,
                    v: Dense::of(&b.attn_v)?,
                    bias: [
                        b.attn_q_bias.clone(),
                        b.attn_k_bias.clone(),
                        b.attn_v_bias.clone(),
                    ],
                    qk_norm,
                    o: Dense::of(&b.attn_output)?,
                    post_attn: norm(ap.post_norm, &b.post_attention_norm, "post_attention_norm")?,
                    ffn_norm: b.ffn_norm.clone(),
                    gate: Dense::of(&gw.ffn_gate)?,
                    up: Dense::of(&gw.ffn_up)?,
                    down: Dense::of(&gw.ffn_down)?,
                    post_ffw: norm(glu.post_norm, &b.post_ffw_norm, "post_ffw_norm")?,
                    act: glu.act,
                    attn: ap.clone(),
                    freqs: octoflow_model::ops::rope_freqs(
                        c.n_rot,
                        ap.rope.base,
                        ap.rope.scale,
                        ff,
                        ap.rope.yarn.as_ref(),
                    ),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if w.token_embd.n_cols != c.n_embd || w.output.n_rows != c.n_vocab {
            return Err(TrainError::Config(format!(
                "the embedding ({} columns) or the output ({} rows) do not match n_embd {} / n_vocab {}",
                w.token_embd.n_cols, w.output.n_rows, c.n_embd, c.n_vocab
            )));
        }
        Ok(Base {
            token_embd: w.token_embd.clone(),
            out_norm: w.output_norm.clone(),
            output: Dense::of(&w.output)?,
            layers,
        })
    }

    /// Bytes of the dequantized matrices.
    pub fn bytes(&self) -> u64 {
        let per_layer = |l: &Layer| -> u64 {
            [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                .iter()
                .map(|d| d.bytes())
                .sum()
        };
        self.output.bytes() + self.layers.iter().map(per_layer).sum::<u64>()
    }
}
