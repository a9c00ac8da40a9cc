//! RoPE of q and k and the KV-cache write in one dispatch (shader `rope_store.comp`): what
//! [`Rope`](crate::Rope) on q, [`Rope`](crate::Rope) on k, a barrier and two
//! [`SetRows`](crate::SetRows) do, for the forward pass (no `inverse`: training rotates with
//! [`Rope`](crate::Rope)).
//!
//! q is rotated in place; k is only read (the rotated key goes straight into the K cache, the
//! `k` scratch keeps the unrotated key); v is copied into the V cache. Rows are addressed as by
//! [`SetRows`](crate::SetRows) with the same [`Positions`].

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::kv_type::{KvType, PerKv, Q8_BLOCK};
use crate::operand::{bad, need, need_kv, overlap, Positions};
use crate::rope::{rope_ref, RopeFreqs, RopeMode};
use crate::set_rows::set_rows_ref;
use crate::shaders;

/// Invocations per workgroup (`local_size_x` in `rope_store.comp`).
const LOCAL_SIZE: u32 = 256;

/// Operands of one rope-and-store dispatch.
pub struct RopeStoreArgs<'a> {
    /// `[n_tokens, n_head, head_dim]` f32 queries, rotated in place.
    pub q: &'a BufferSlice,
    /// `[n_tokens, n_head_kv, head_dim]` f32 keys, read only (left unrotated).
    pub k: &'a BufferSlice,
    /// `[n_tokens, n_head_kv * head_dim_v]` f32 values, read only.
    pub v: &'a BufferSlice,
    /// Key cache `[n_ctx, n_head_kv * head_dim]` of `kv`: token `t`'s rotated key goes to its
    /// row (rounded to `kv`).
    pub k_cache: &'a BufferSlice,
    /// Value cache `[n_ctx, n_head_kv * head_dim_v]` of `kv`: token `t`'s value goes to its row.
    pub v_cache: &'a BufferSlice,
    /// Element type of both caches.
    pub kv: KvType,
    /// Rows of each cache; tokens whose row lands at or past it are not stored.
    pub n_ctx: u32,
    /// Tokens.
    pub n_tokens: u32,
    /// Query heads per token.
    pub n_head: u32,
    /// Key/value heads per token.
    pub n_head_kv: u32,
    /// Width of a query/key head.
    pub head_dim: u32,
    /// Width of a value head.
    pub head_dim_v: u32,
    /// Pair layout.
    pub mode: RopeMode,
    /// The angles (and `n_rot`: dims `>= n_rot` pass through).
    pub freqs: &'a RopeFreqs,
    /// u32 buffer: with [`Positions::Run`], token `t` is at position and cache row
    /// `pos[pos_offset] + t`; with [`Positions::Table`], at position `pos[pos_offset + 2t]` and
    /// cache row `pos[pos_offset + 2t + 1] + pos[pos_offset + 2t]` (positions below 2^24).
    pub pos: &'a BufferSlice,
    /// Index of the first word read in `pos`.
    pub pos_offset: u32,
    /// How `pos` is read.
    pub positions: Positions,
}

/// The rope-and-store kernel, built once per device.
pub struct RopeStore {
    /// The f16 one where the device has 16-bit storage buffers.
    pipelines: PerKv<Option<Pipeline>>,
}

impl RopeStore {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        let f16 = if KvType::F16.supported(ctx.caps()) {
            Some(Pipeline::new(
                ctx,
                &PipelineDesc::new(shaders::ROPE_STORE_KV16, 7, 44),
            )?)
        } else {
            None
        };
        Ok(RopeStore {
            pipelines: PerKv {
                f32: Some(Pipeline::new(
                    ctx,
                    &PipelineDesc::new(shaders::ROPE_STORE, 7, 44),
                )?),
                f16,
                q8: Some(Pipeline::new(
                    ctx,
                    &PipelineDesc::new(shaders::ROPE_STORE_KVQ8, 7, 44),
                )?),
            },
        })
    }

    /// Records the rotation of `a.q` in place and the store of the rotated `a.k` and of `a.v`
    /// into the caches (angles as in [`Rope::record`](crate::Rope::record)). The operands
    /// written (q and the caches) must not overlap any other operand.
    pub fn record(&self, chain: &mut Chain, a: &RopeStoreArgs) -> Result<()> {
        const OP: &str = "rope_store";
        a.freqs.check(OP, a.head_dim)?;
        let n_rot = a.freqs.n_rot;
        let n = u128::from(a.n_tokens);
        let k_width = u128::from(a.n_head_kv) * u128::from(a.head_dim);
        let v_width = u128::from(a.n_head_kv) * u128::from(a.head_dim_v);
        let q_len = n * u128::from(a.n_head) * u128::from(a.head_dim);
        let half = u128::from(n_rot / 2);
        a.kv.check_heads(a.head_dim as usize, a.head_dim_v as usize)
            .map_err(|e| bad(OP, e))?;
        // work items: q pairs, k pairs plus pass-through dims, v values (see the shader); for
        // q8_0 caches whole blocks of k and v
        let items = n * u128::from(a.n_head) * half
            + match a.kv {
                KvType::Q8_0 => n * (k_width + v_width) / Q8_BLOCK as u128,
                _ => n * u128::from(a.n_head_kv) * (u128::from(a.head_dim) - half) + n * v_width,
            };
        let cache = u128::from(a.n_ctx) * k_width.max(v_width);
        let max = u128::from(u32::MAX);
        if q_len == 0 || k_width == 0 || v_width == 0 || a.n_ctx == 0 {
            return Err(bad(
                OP,
                format!(
                    "empty shape: {} tokens, {} heads, {} kv heads of {} / {}, {} cache rows",
                    a.n_tokens, a.n_head, a.n_head_kv, a.head_dim, a.head_dim_v, a.n_ctx
                ),
            ));
        }
        if q_len.max(items).max(cache) > max {
            return Err(bad(OP, format!("shape too large: {items} work items")));
        }
        need(OP, "q", a.q, q_len)?;
        need(OP, "k", a.k, n * k_width)?;
        need(OP, "v", a.v, n * v_width)?;
        need_kv(
            OP,
            "k_cache",
            a.k_cache,
            u128::from(a.n_ctx) * k_width,
            a.kv,
        )?;
        need_kv(
            OP,
            "v_cache",
            a.v_cache,
            u128::from(a.n_ctx) * v_width,
            a.kv,
        )?;
        let Some(pipeline) = self.pipelines.get(OP, chain.context().caps(), a.kv)? else {
            return Err(bad(OP, format!("no {} KV cache pipeline was built", a.kv)));
        };
        need(
            OP,
            "pos",
            a.pos,
            u128::from(a.pos_offset) + a.positions.words(a.n_tokens),
        )?;
        let operands = [
            ("q", a.q),
            ("k", a.k),
            ("v", a.v),
            ("k_cache", a.k_cache),
            ("v_cache", a.v_cache),
            ("pos", a.pos),
            ("freqs", &a.freqs.table),
        ];
        for (i, (wn, w)) in operands.iter().enumerate() {
            if !matches!(*wn, "q" | "k_cache" | "v_cache") {
                continue;
            }
            for (j, (on, o)) in operands.iter().enumerate() {
                if i != j && overlap(w, o) {
                    return Err(bad(OP, format!("{wn} overlaps {on}")));
                }
            }
        }
        let groups = chain.context().groups_1d(items as u64, LOCAL_SIZE)?;
        let push = Push::new()
            .u32(a.n_tokens)
            .u32(a.n_head)
            .u32(a.n_head_kv)
            .u32(a.head_dim)
            .u32(n_rot)
            .u32(v_width as u32)
            .u32(a.n_ctx)
            .u32(u32::from(a.mode == RopeMode::Neox))
            .u32(a.pos_offset)
            .f32(a.freqs.mscale)
            .u32(a.positions.flag());
        chain.dispatch(
            pipeline,
            &[
                a.q.clone(),
                a.k.clone(),
                a.v.clone(),
                a.k_cache.clone(),
                a.v_cache.clone(),
                a.pos.clone(),
                a.freqs.table.clone(),
            ],
            &push,
            groups,
        )?;
        Ok(())
    }
}

/// Shape and RoPE pairing of [`rope_store_ref`] (as in [`RopeStoreArgs`]).
#[derive(Debug, Clone, Copy)]
pub struct RopeStoreShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub mode: RopeMode,
    /// What the caches hold: stored keys and values are rounded to it.
    pub kv: KvType,
}

/// CPU reference, the composition of [`rope_ref`] and [`set_rows_ref`]: for token `t` at
/// `(position, cache row) = rows[t]`, rotates row `t` of `q` (`[n, n_head, head_dim]`) in place
/// at `position`, rotates a copy of row `t` of `k` (`[n, n_head_kv, head_dim]`) at `position`
/// and writes it to row `cache row` of `k_cache`, and writes row `t` of `v`
/// (`[n, n_head_kv * head_dim_v]`) to that row of `v_cache` (rows past a cache's end skipped).
/// `k` is not modified. The angles are [`rope_ref`]'s: `freqs` per pair, times `mscale`. The
/// stored keys and values are rounded to `s.kv` (`f16` caches: the `half` crate's rounding to
/// nearest even; q8_0: [`KvType::round`]'s blocks of a row), the caches themselves stay f32
/// slices.
#[allow(clippy::too_many_arguments)]
pub fn rope_store_ref(
    q: &mut [f32],
    k: &[f32],
    v: &[f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    s: &RopeStoreShape,
    freqs: &[f64],
    mscale: f32,
    rows: &[(usize, usize)],
) {
    let (q_width, k_width) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim);
    let v_width = s.n_head_kv * s.head_dim_v;
    let rope = |x: &mut [f32], n_heads: usize, at: usize| {
        rope_ref(x, n_heads, s.head_dim, s.mode, freqs, mscale, at);
    };
    for (t, &(position, row)) in rows.iter().enumerate() {
        rope(&mut q[t * q_width..(t + 1) * q_width], s.n_head, position);
        let mut key = k[t * k_width..(t + 1) * k_width].to_vec();
        rope(&mut key, s.n_head_kv, position);
        set_rows_ref(&s.kv.round(&key), k_cache, k_width, row);
        set_rows_ref(
            &s.kv.round(&v[t * v_width..(t + 1) * v_width]),
            v_cache,
            v_width,
            row,
        );
    }
}

/// The `(position, cache row)` of each of `n` tokens of a [`Positions::Run`] from `start`.
pub fn run_rows(start: usize, n: usize) -> Vec<(usize, usize)> {
    (start..start + n).map(|p| (p, p)).collect()
}

#[cfg(test)]
#[path = "rope_store_tests.rs"]
mod tests;
