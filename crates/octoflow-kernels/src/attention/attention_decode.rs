//! Decode attention in one dispatch (shader `attention_decode.comp`, flash decoding): what
//! [`crate::Attention::record`] uses when each sequence has few query tokens, i.e. run mode
//! ([`Positions::Run`]) with at most [`DECODE_MAX_TOKENS`] tokens, or table mode
//! ([`Positions::Table`], batched decode of many streams, where every token is attended on its
//! own anyway). Prefill (longer runs) keeps `attention.comp`, whose clusters share every K/V
//! row among the run's tokens.
//!
//! One workgroup handles one (token, KV head, chunk of its GQA query heads, key piece); the
//! pieces of a (token, KV head, head chunk) are merged inside the same dispatch by the last of
//! their workgroups to finish (an atomic counter per queue, reset by that workgroup).
//!
//! [`crate::Attention::record_fresh`] takes the variant `attention_decode_fresh` for a decode
//! step whose keys and values are not stored yet: it reads the raw q, k and v of the step
//! ([`FreshKv`]), applies the per-head RMSNorm of q and k (gemma3) and RoPE itself, and writes
//! the step's keys and values into the cache: what `rms_norm` (q, k heads), `rope_store` and two
//! or three barriers did, so a decode layer has one or two barrier stages fewer.

use octoflow_vk::{BufferSlice, Chain, DeviceCaps, DeviceKind, Push};

use crate::attention::{grid, kv_total, validate, AttentionArgs};
use crate::error::Result;
use crate::kv_type::PerKv;
use crate::operand::{bad, need, need_kv, overlap, Positions};
use crate::rope::{RopeFreqs, RopeMode};
use crate::scratch::QueueScratch;
use crate::shaders;
use crate::spec::SpecPipelines;

/// Run-mode dispatches of at most this many query tokens take the decode kernel.
pub const DECODE_MAX_TOKENS: u32 = 8;
/// Most query heads per workgroup (`HB`); larger GQA groups are cut into even chunks.
const MAX_HEADS: u32 = 8;
/// Invocations per workgroup.
const WG: u32 = 128;
/// Invocations per workgroup on a GPU in run mode (one sequence).
const RUN_WG: u32 = 256;
/// Most key pieces per (token, KV head, head chunk).
const MAX_SPLIT: u32 = 64;
/// On a GPU, GQA groups are cut into head chunks until there are about this many
/// (token, KV head, head chunk) workgroups before the keys are split.
const HEAD_TARGET: u32 = 32;
/// On a GPU, caches of at least this many rows take the long-context layout.
const LONG_ROWS: u32 = 4096;

/// Whether [`crate::Attention::record`] takes the decode kernel for `a`.
pub(crate) fn applies(a: &AttentionArgs) -> bool {
    a.positions == Positions::Table || a.n_tokens <= DECODE_MAX_TOKENS
}

/// The step's own keys and values, before RoPE (and before the per-head RMSNorm of q and k),
/// for [`crate::Attention::record_fresh`]: the attention's `q` is then the raw query too, and
/// its `k` / `v` are the caches, into which token `t`'s rotated key and its value are written
/// at row `pos[pos_offset] + t` (rows at or past `n_ctx` are not stored).
pub struct FreshKv<'a> {
    /// `[n_tokens, n_head_kv, head_dim]` f32 keys of the step, unrotated (read only).
    pub k: &'a BufferSlice,
    /// `[n_tokens, n_head_kv * head_dim_v]` f32 values of the step (read only).
    pub v: &'a BufferSlice,
    /// Rows of each cache.
    pub n_ctx: u32,
    /// Pair layout.
    pub mode: RopeMode,
    /// The angles (and `n_rot`), as [`crate::RopeStoreArgs`] takes them.
    pub freqs: &'a RopeFreqs,
    /// Per-head RMSNorm of q and of k before the rotation: the `[head_dim]` f32 weights of q and
    /// of k, and epsilon (as [`crate::RmsNorm::record`] over head rows).
    pub qk_norm: Option<(&'a BufferSlice, &'a BufferSlice, f32)>,
}

/// Whether [`crate::Attention::record_fresh`] can record `a` (a run of at most
/// [`DECODE_MAX_TOKENS`] tokens).
pub fn fresh_applies(a: &AttentionArgs) -> bool {
    a.positions == Positions::Run && a.n_tokens <= DECODE_MAX_TOKENS
}

/// Work layout of one decode dispatch (the specialization of `attention_decode.comp` plus the
/// split; see the shader's header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct DecodePlan {
    /// Invocations per workgroup (a power of two, a multiple of the subgroup size).
    pub wg: u32,
    /// Lanes per key when scoring (a power of two, at most the subgroup size).
    pub lpk: u32,
    /// Query heads per workgroup.
    pub hb: u32,
    /// Key groups of the P.V product (a power of two, at most the subgroup size).
    pub kg: u32,
    /// Key pieces (workgroups) per (token, KV head, head chunk).
    pub split: u32,
    /// Fewest keys per piece (the shader cuts `len` keys into max(ceil(len / split), this)).
    pub min_chunk: u32,
}

/// Largest power of two `<= x` (`x >= 1`).
fn floor_pow2(x: u32) -> u32 {
    1 << (31 - x.max(1).leading_zeros())
}

/// Picks the decode layout for a device and shape. A workgroup's latency grows with the heads
/// and tiles it walks, while a launch costs a few microseconds however little it does and
/// merging pieces costs about as much again; hence:
/// - GPU: with few (token, KV head) pairs, the GQA group is first cut into single heads (more
///   workgroups, each with less serial work), then the keys into pieces of at least
///   `min_chunk` = 64 keys until ~256 workgroups; a context of up to 64 keys is one piece (no
///   merge). Batches of many streams keep whole groups (every K/V row serves all of them).
/// - GPU, one sequence (run mode): workgroups of 256 and at most 4 vec4s of a key row per lane
///   (lanes per key >= head_dim / 16), so that wide heads (256) do not spill q and the K tiles
///   out of registers. Batches of many streams (position tables) keep 128.
/// - GPU, caches of `LONG_ROWS` rows or more: whole GQA groups (a workgroup holding every
///   head of a group reads each K/V row once for all of them), the keys split into about one
///   workgroup per compute unit (at most `MAX_SPLIT` pieces): a workgroup's registers hold one
///   per unit, and more pieces than that wait for a second round and lengthen the merge,
///   whose loads grow with the pieces.
/// - CPU (lavapipe): whole groups, a few pieces: SIMD lanes are not free there.
///
/// The split is fixed when the chain is recorded (positions change between replays), from the
/// cache capacity `n_kv_rows`; the shader cuts the actual key range into pieces of
/// max(ceil(len / split), min_chunk) keys.
pub(crate) fn plan(caps: &DeviceCaps, a: &AttentionArgs) -> DecodePlan {
    let cpu = caps.kind == DeviceKind::Cpu;
    let sg = floor_pow2(caps.subgroup.size.clamp(1, WG));
    let group = a.n_head / a.n_head_kv;
    let pairs = a.n_tokens.saturating_mul(a.n_head_kv);
    let long = !cpu && a.n_kv_rows >= LONG_ROWS;
    let units = caps
        .compute_units
        .unwrap_or(crate::tuning::FALLBACK_COMPUTE_UNITS)
        .max(1);
    let n_hc = if cpu || long {
        1
    } else {
        HEAD_TARGET.div_ceil(pairs.max(1)).clamp(1, group)
    };
    let n_hc = n_hc.max(group.div_ceil(MAX_HEADS));
    let hb = group.div_ceil(n_hc); // even chunks
    let run = !cpu && a.positions == Positions::Run;
    let wg = if run { RUN_WG } else { WG };
    // lanes per key: the lane's share of the queries (hb * NK4 vec4s) stays <= 32 vec4s, and
    // in run mode a lane's share of a key row <= 4 vec4s
    let by_heads = (a.head_dim * hb).div_ceil(128).next_power_of_two();
    let by_row = if run {
        a.head_dim.div_ceil(16).next_power_of_two()
    } else {
        1
    };
    let lpk = by_heads.max(by_row).clamp(4, 16).min(sg);
    let nvl = a.head_dim_v.div_ceil(4);
    let kg = floor_pow2(wg / nvl).min(sg);
    let tile = wg / lpk;
    let min_chunk = if cpu { tile } else { tile.max(64) };
    let groups = pairs.saturating_mul(group.div_ceil(hb));
    // pieces per (token, KV head, head chunk): long contexts at most one workgroup per unit in
    // all (a second round costs more than it spreads), others at least ~256 workgroups (8 on a
    // CPU)
    let per_group = if cpu {
        8u32.div_ceil(groups.max(1))
    } else if long {
        (units / groups.max(1)).max(1)
    } else {
        256u32.div_ceil(groups.max(1))
    };
    let split = per_group
        .min(a.n_kv_rows.div_ceil(min_chunk))
        .clamp(1, MAX_SPLIT);
    DecodePlan {
        wg,
        lpk,
        hb,
        kg,
        split,
        min_chunk,
    }
}

/// The decode kernel's pipelines (specialized per head shape on first use) and its per-queue
/// scratch: the pieces' partial results and the zero-initialized arrival counters.
pub(crate) struct Decode {
    pipelines: PerKv<SpecPipelines>,
    fresh: PerKv<SpecPipelines>,
    part: QueueScratch,
    counts: QueueScratch,
}

impl Decode {
    pub(crate) fn new() -> Self {
        Decode {
            pipelines: PerKv {
                f32: SpecPipelines::new(shaders::ATTENTION_DECODE, 8, 56, "attention_decode"),
                f16: SpecPipelines::new(
                    shaders::ATTENTION_DECODE_KV16,
                    8,
                    56,
                    "attention_decode_kv16",
                ),
                q8: SpecPipelines::new(
                    shaders::ATTENTION_DECODE_KVQ8,
                    8,
                    56,
                    "attention_decode_kvq8",
                ),
            },
            fresh: PerKv {
                f32: SpecPipelines::new(
                    shaders::ATTENTION_DECODE_FRESH,
                    15,
                    80,
                    "attention_decode_fresh",
                ),
                f16: SpecPipelines::new(
                    shaders::ATTENTION_DECODE_FRESH_KV16,
                    15,
                    80,
                    "attention_decode_fresh_kv16",
                ),
                q8: SpecPipelines::new(
                    shaders::ATTENTION_DECODE_FRESH_KVQ8,
                    15,
                    80,
                    "attention_decode_fresh_kvq8",
                ),
            },
            part: QueueScratch::new("attention_decode_part"),
            counts: QueueScratch::zeroed("attention_decode_count"),
        }
    }

    /// Records `a` with layout `p` (shapes and the layout checked first).
    pub(crate) fn record(&self, chain: &mut Chain, a: &AttentionArgs, p: DecodePlan) -> Result<()> {
        validate(a)?;
        self.dispatch(chain, a, p, None)
    }

    /// Records `a` over the step's own keys and values `f` with layout `p` (see [`FreshKv`]).
    pub(crate) fn record_fresh(
        &self,
        chain: &mut Chain,
        a: &AttentionArgs,
        f: &FreshKv,
        p: DecodePlan,
    ) -> Result<()> {
        const OP: &str = "attention_fresh";
        validate(a)?;
        if !fresh_applies(a) {
            return Err(bad(
                OP,
                format!(
                    "a run of at most {DECODE_MAX_TOKENS} tokens is needed ({} tokens, {:?})",
                    a.n_tokens, a.positions
                ),
            ));
        }
        f.freqs.check(OP, a.head_dim)?;
        let n = u128::from(a.n_tokens);
        let hk = u128::from(a.n_head_kv);
        let k_width = hk * u128::from(a.head_dim);
        let v_width = hk * u128::from(a.head_dim_v);
        need(OP, "k", f.k, n * k_width)?;
        need(OP, "v", f.v, n * v_width)?;
        need_kv(OP, "k_cache", a.k, u128::from(f.n_ctx) * k_width, a.kv)?;
        need_kv(OP, "v_cache", a.v, u128::from(f.n_ctx) * v_width, a.kv)?;
        if let Some((qw, kw, _)) = f.qk_norm {
            need(OP, "q_norm", qw, u128::from(a.head_dim))?;
            need(OP, "k_norm", kw, u128::from(a.head_dim))?;
        }
        // what is written (out, the caches) must not overlap what is read
        let read = [("q", a.q), ("k", f.k), ("v", f.v), ("pos", a.pos)];
        for (wn, w) in [("out", a.out), ("k_cache", a.k), ("v_cache", a.v)] {
            for (rn, r) in read {
                if overlap(w, r) {
                    return Err(bad(OP, format!("{wn} overlaps {rn}")));
                }
            }
        }
        self.dispatch(chain, a, p, Some(f))
    }

    /// Records validated `a` with layout `p` (checked here) through the plain or (with `fresh`)
    /// the fused variant.
    fn dispatch(
        &self,
        chain: &mut Chain,
        a: &AttentionArgs,
        p: DecodePlan,
        fresh: Option<&FreshKv>,
    ) -> Result<()> {
        const OP: &str = "attention";
        let sg = chain.context().caps().subgroup.size;
        let pow2 = |x: u32| x.is_power_of_two();
        let nvl = a.head_dim_v.div_ceil(4);
        if !(pow2(p.wg) && pow2(p.lpk) && pow2(p.kg))
            || p.lpk > sg.min(p.wg)
            || p.kg > sg
            || p.kg * nvl > p.wg
            || p.hb == 0
            || p.split == 0
            || p.wg < sg
        {
            return Err(bad(
                OP,
                format!(
                    "decode layout {p:?} does not fit head_dim_v {} and subgroups of {sg}",
                    a.head_dim_v
                ),
            ));
        }
        let ctx = chain.context().clone();
        let aligned = a.head_dim.is_multiple_of(4) && a.head_dim_v.is_multiple_of(4);
        let spec = [
            p.wg,
            p.lpk,
            a.head_dim.div_ceil(4 * p.lpk),
            nvl,
            p.hb,
            p.kg,
            u32::from(aligned),
        ];
        let pipelines = if fresh.is_some() {
            &self.fresh
        } else {
            &self.pipelines
        };
        let pipeline = pipelines.get(OP, ctx.caps(), a.kv)?.get(&ctx, spec)?;
        let group = a.n_head / a.n_head_kv;
        let n_hc = group.div_ceil(p.hb);
        let rows = u64::from(a.n_tokens) * u64::from(a.n_head);
        // scratch is bound even with one piece (never touched then): a small buffer
        let floats = if p.split > 1 {
            rows * u64::from(p.split) * (4 * u64::from(nvl) + 2)
        } else {
            1
        };
        let part = self.part.get_slice(chain, 4 * floats)?;
        let n_counts = u64::from(a.n_tokens) * u64::from(a.n_head_kv) * u64::from(n_hc);
        let counts = self.counts.get_slice(chain, 4 * n_counts)?;
        let mut push = Push::new()
            .u32(a.n_tokens)
            .u32(a.n_head)
            .u32(a.n_head_kv)
            .u32(a.head_dim)
            .u32(a.head_dim_v)
            .u32(a.n_kv_rows)
            .u32(a.window)
            .u32(a.pos_offset)
            .f32(a.scale)
            .u32(p.split)
            .u32(a.positions.flag())
            .u32(kv_total(a))
            .u32(p.min_chunk)
            .u32(a.has_sinks());
        let groups = n_counts * u64::from(p.split);
        let mut bindings = vec![
            a.q.clone(),
            a.k.clone(),
            a.v.clone(),
            a.out.clone(),
            a.pos.clone(),
            part,
            counts,
            a.sinks_binding().clone(),
        ];
        if let Some(f) = fresh {
            push = push
                .u32(f.freqs.n_rot)
                .u32(u32::from(f.mode == RopeMode::Neox))
                .f32(f.freqs.mscale)
                .u32(u32::from(f.qk_norm.is_some()))
                .f32(f.qk_norm.map_or(0.0, |n| n.2))
                .u32(f.n_ctx);
            // unused operands bind something valid (never read)
            let (qw, kw) = f.qk_norm.map_or((f.k, f.k), |n| (n.0, n.1));
            bindings.extend([
                f.k.clone(),
                f.v.clone(),
                a.k.clone(),
                a.v.clone(),
                qw.clone(),
                kw.clone(),
                f.freqs.table.clone(),
            ]);
        }
        chain.dispatch(&pipeline, &bindings, &push, grid(groups, OP)?)?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "attention_decode_tests.rs"]
mod tests;
