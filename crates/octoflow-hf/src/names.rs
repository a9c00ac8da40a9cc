//! Hugging Face tensor names → GGUF tensor names (llama.cpp's `gguf-py` tensor map), with the
//! shape each must have under `config.json`, and the Q/K row permutation of the llama family.

use crate::config::{Family, HfConfig};

/// What to do with one HF tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    /// The GGUF name (`blk.0.attn_q.weight`).
    pub gguf: String,
    /// The shape config.json implies, PyTorch order (`[out, in]`).
    pub shape: Vec<u64>,
    /// Heads whose rows are permuted from rotate-half to interleaved pairs, if any.
    pub permute_heads: Option<u64>,
}

/// Tensors a checkpoint may carry that inference does not use.
pub fn ignored(hf: &str) -> bool {
    hf.ends_with(".rotary_emb.inv_freq")
}

/// The mapping of `hf`, or `None` for a name this family does not have.
pub fn map(cfg: &HfConfig, hf: &str) -> Option<Mapped> {
    let (e, v, ff) = (cfg.n_embd, cfg.n_vocab, cfg.n_ff);
    let q = cfg.n_head * cfg.head_dim;
    let kv = cfg.n_head_kv * cfg.head_dim;
    let one = |gguf: &str, shape: Vec<u64>| {
        Some(Mapped {
            gguf: gguf.to_string(),
            shape,
            permute_heads: None,
        })
    };
    match hf {
        "model.embed_tokens.weight" => return one("token_embd.weight", vec![v, e]),
        "model.norm.weight" => return one("output_norm.weight", vec![e]),
        "lm_head.weight" => return one("output.weight", vec![v, e]),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let il: u64 = layer.parse().ok()?;
    if il >= cfg.n_layer || layer != il.to_string() {
        return None;
    }
    let rotate = cfg.family == Family::Llama;
    let oss = cfg.family == Family::GptOss;
    let n_exp = cfg.n_expert;
    let (name, shape, permute) = match rest {
        "input_layernorm.weight" => ("attn_norm.weight", vec![e], None),
        // llama.cpp's gpt-oss names its feed-forward pre-norm after the attention
        "post_attention_layernorm.weight" if oss => ("post_attention_norm.weight", vec![e], None),
        "post_attention_layernorm.weight" => ("ffn_norm.weight", vec![e], None),
        "self_attn.o_proj.bias" if oss => ("attn_output.bias", vec![e], None),
        "self_attn.sinks" if oss => ("attn_sinks.weight", vec![cfg.n_head], None),
        "mlp.router.weight" if oss => ("ffn_gate_inp.weight", vec![n_exp, e], None),
        "mlp.router.bias" if oss => ("ffn_gate_inp.bias", vec![n_exp], None),
        "self_attn.q_proj.weight" => ("attn_q.weight", vec![q, e], rotate.then_some(cfg.n_head)),
        "self_attn.k_proj.weight" => (
            "attn_k.weight",
            vec![kv, e],
            rotate.then_some(cfg.n_head_kv),
        ),
        "self_attn.v_proj.weight" => ("attn_v.weight", vec![kv, e], None),
        "self_attn.o_proj.weight" => ("attn_output.weight", vec![e, q], None),
        "self_attn.q_proj.bias" if cfg.family != Family::Qwen3 => {
            ("attn_q.bias", vec![q], rotate.then_some(cfg.n_head))
        }
        "self_attn.k_proj.bias" if cfg.family != Family::Qwen3 => {
            ("attn_k.bias", vec![kv], rotate.then_some(cfg.n_head_kv))
        }
        "self_attn.v_proj.bias" if cfg.family != Family::Qwen3 => ("attn_v.bias", vec![kv], None),
        "self_attn.q_norm.weight" if cfg.family == Family::Qwen3 => {
            ("attn_q_norm.weight", vec![cfg.head_dim], None)
        }
        "self_attn.k_norm.weight" if cfg.family == Family::Qwen3 => {
            ("attn_k_norm.weight", vec![cfg.head_dim], None)
        }
        "mlp.gate_proj.weight" if !oss => ("ffn_gate.weight", vec![ff, e], None),
        "mlp.up_proj.weight" if !oss => ("ffn_up.weight", vec![ff, e], None),
        "mlp.down_proj.weight" if !oss => ("ffn_down.weight", vec![e, ff], None),
        _ => return None,
    };
    Some(Mapped {
        gguf: format!("blk.{il}.{name}"),
        shape,
        permute_heads: permute,
    })
}

/// The HF names a family must have (biases and the output matrix are checked where they apply).
pub fn required(cfg: &HfConfig) -> Vec<String> {
    let mut names = vec![
        "model.embed_tokens.weight".to_string(),
        "model.norm.weight".to_string(),
    ];
    if !cfg.tie_word_embeddings {
        names.push("lm_head.weight".into());
    }
    for il in 0..cfg.n_layer {
        let mut per = vec![
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
        ];
        if cfg.family != Family::GptOss {
            per.extend([
                "mlp.gate_proj.weight",
                "mlp.up_proj.weight",
                "mlp.down_proj.weight",
            ]);
        }
        match cfg.family {
            // the experts' tensors are read apart (`experts`)
            Family::GptOss => per.extend([
                "self_attn.q_proj.bias",
                "self_attn.k_proj.bias",
                "self_attn.v_proj.bias",
                "self_attn.o_proj.bias",
                "self_attn.sinks",
                "mlp.router.weight",
                "mlp.router.bias",
            ]),
            Family::Qwen2 => per.extend([
                "self_attn.q_proj.bias",
                "self_attn.k_proj.bias",
                "self_attn.v_proj.bias",
            ]),
            Family::Qwen3 => per.extend(["self_attn.q_norm.weight", "self_attn.k_norm.weight"]),
            Family::Llama => {}
        }
        names.extend(per.into_iter().map(|p| format!("model.layers.{il}.{p}")));
    }
    names
}

/// GPT-OSS's expert tensors of layer `il` as stored in MXFP4 (OpenAI's checkpoints): the
/// `gate_up` blocks and scales (gate and up rows interleaved), the down blocks and scales, and
/// the two biases.
pub fn expert_tensors(il: u64) -> [String; 6] {
    [
        "gate_up_proj_blocks",
        "gate_up_proj_scales",
        "gate_up_proj_bias",
        "down_proj_blocks",
        "down_proj_scales",
        "down_proj_bias",
    ]
    .map(|t| format!("model.layers.{il}.mlp.experts.{t}"))
}

/// Reorders the rows of a Q or K projection (or bias) from Hugging Face's rotate-half layout
/// (each head's first half of rows pairs with its second half) to GGUF's interleaved pairs (rows
/// 2i and 2i+1 pair), as llama.cpp's converter does for the llama family: within each head, new
/// row `2i + j` is old row `j·d/2 + i`. `row_bytes` is one row's size, so any dtype works.
pub fn permute_rows(data: &[u8], n_head: usize, row_bytes: usize) -> Vec<u8> {
    let n_rows = data.len() / row_bytes;
    let head_dim = n_rows / n_head;
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(data.len());
    for h in 0..n_head {
        for i in 0..half {
            for j in 0..2 {
                let old = h * head_dim + j * half + i;
                out.extend_from_slice(&data[old * row_bytes..(old + 1) * row_bytes]);
            }
        }
    }
    out
}

/// The inverse of [`permute_rows`]: GGUF's interleaved pairs back to Hugging Face's rotate-half
/// layout (within each head, new row `j·d/2 + i` is old row `2i + j`).
pub fn unpermute_rows(data: &[u8], n_head: usize, row_bytes: usize) -> Vec<u8> {
    let n_rows = data.len() / row_bytes;
    let head_dim = n_rows / n_head;
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(data.len());
    for h in 0..n_head {
        for j in 0..2 {
            for i in 0..half {
                let old = h * head_dim + 2 * i + j;
                out.extend_from_slice(&data[old * row_bytes..(old + 1) * row_bytes]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{permute_rows, unpermute_rows};

    #[test]
    fn unpermute_undoes_permute() {
        let rows: Vec<u8> = (0..48).collect();
        for (n_head, row_bytes) in [(1, 1), (2, 2), (3, 4)] {
            let there = permute_rows(&rows, n_head, row_bytes);
            assert_eq!(unpermute_rows(&there, n_head, row_bytes), rows);
        }
    }

    #[test]
    fn permute_interleaves_each_heads_halves() {
        // Two heads of dimension 4, one byte per row: head rows [a0 a1 b0 b1] → [a0 b0 a1 b1].
        let rows = [0u8, 1, 2, 3, 10, 11, 12, 13];
        assert_eq!(permute_rows(&rows, 2, 1), vec![0, 2, 1, 3, 10, 12, 11, 13]);
    }
}
