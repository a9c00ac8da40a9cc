//! Transposed f16 copies of the frozen matrices, so the input gradients run on tensor cores.
//!
//! `dX = dY · W` through a projection `y = W x` is `dY · (Wᵀ)ᵀ`: with `Wᵀ` stored as an F16
//! matrix it is the same product `Linear` runs for the forward, which takes cooperative
//! matrices on devices that have them, where `LinearT` (the input gradient through the GGUF
//! encoding) is a plain f32 shared-memory kernel. The copies cost 2 bytes per weight of device
//! memory for the whole run (the base is frozen, so they are made once, on the host). They are
//! worth it only where the forward's products run on cooperative matrices, whose operands are
//! f16 anyway: elsewhere `LinearT` reads the exact weights (the CLI decides, see
//! [`super::Trainer::set_transposed`]).

use std::collections::HashMap;

use half::f16;
use octoflow_gguf::GgmlType;
use octoflow_model::gpu::weights::{GpuMatrix, Piece};
use octoflow_model::{Model, QMatrix};
use octoflow_vk::{Buffer, Context, MemoryKind};
use rayon::prelude::*;

use crate::error::Result;

/// Side of the square tiles the host transposes through the cache.
const TILE: usize = 64;

/// `Wᵀ` in f16 for each frozen matrix of a model, by the matrix's name.
pub struct TransposedWeights {
    by_name: HashMap<String, GpuMatrix>,
    bytes: u64,
}

impl TransposedWeights {
    /// Dequantizes, transposes and uploads every matrix the training step multiplies through
    /// (each layer's seven projections and the output matrix).
    pub fn build(ctx: &Context, model: &Model) -> Result<Self> {
        let w = &model.weights;
        let mut mats: Vec<&QMatrix> = vec![&w.output];
        for b in &w.blk {
            let g = b.glu()?;
            mats.extend([&b.attn_q, &b.attn_k, &b.attn_v, &b.attn_output]);
            mats.extend([&g.ffn_gate, &g.ffn_up, &g.ffn_down]);
        }
        let mut by_name = HashMap::new();
        let mut bytes = 0;
        for q in mats {
            if by_name.contains_key(&q.name) {
                continue;
            }
            let t = upload(ctx, q)?;
            bytes += 2 * (q.n_rows * q.n_cols) as u64;
            by_name.insert(q.name.clone(), t);
        }
        Ok(TransposedWeights { by_name, bytes })
    }

    /// The transposed copy of the matrix named `name`.
    pub fn get(&self, name: &str) -> Option<&GpuMatrix> {
        self.by_name.get(name)
    }

    /// Device bytes of the copies.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// `Wᵀ` `[n_cols, n_rows]` as f16, row-major.
fn transpose_f16(q: &QMatrix) -> Result<Vec<f16>> {
    let (r, c) = (q.n_rows, q.n_cols);
    let mut w = vec![0f32; r * c];
    w.par_chunks_mut(TILE * c)
        .enumerate()
        .try_for_each(|(i, out)| q.dequantize_rows(i * TILE, out))?;
    let mut t = vec![f16::ZERO; r * c];
    // each task writes TILE rows of Wᵀ (TILE columns of W), reading W in TILE × TILE tiles
    t.par_chunks_mut(TILE * r)
        .enumerate()
        .for_each(|(jt, out)| {
            let j0 = jt * TILE;
            let cols = out.len() / r;
            for i0 in (0..r).step_by(TILE) {
                for i in i0..(i0 + TILE).min(r) {
                    for dj in 0..cols {
                        out[dj * r + i] = f16::from_f32(w[i * c + j0 + dj]);
                    }
                }
            }
        });
    Ok(t)
}

/// The transposed copy of `q` on the device, split by rows into pieces that each fit one
/// binding.
fn upload(ctx: &Context, q: &QMatrix) -> Result<GpuMatrix> {
    let t = transpose_f16(q)?;
    let (rows, cols) = (q.n_cols, q.n_rows);
    let row_bytes = 2 * cols as u64;
    let max_rows = (ctx.caps().max_buffer_bytes() / row_bytes).max(1) as usize;
    let mut pieces = Vec::new();
    let mut r0 = 0;
    while r0 < rows {
        let n = max_rows.min(rows - r0);
        // 16-byte padding past the end, as the weight packs have (kernels read whole words)
        let size = (n as u64 * row_bytes).div_ceil(16) * 16;
        let name = format!("{}.T{}", q.name, pieces.len());
        let buf = Buffer::new(ctx, &name, size, MemoryKind::DeviceLocal)?;
        ctx.upload(&buf, 0, &t[r0 * cols..(r0 + n) * cols])?;
        pieces.push(Piece {
            slice: buf.whole(),
            row_begin: r0 as u32,
            n_rows: n as u32,
        });
        r0 += n;
    }
    Ok(GpuMatrix {
        name: format!("{}ᵀ", q.name),
        ty: GgmlType::F16,
        n_rows: rows as u32,
        n_cols: cols as u32,
        pieces,
    })
}
