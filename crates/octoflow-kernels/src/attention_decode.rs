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

use octoflow_vk::{Chain, DeviceCaps, DeviceKind, Push};

use crate::attention::{grid, kv_total, validate, AttentionArgs};
use crate::error::Result;
use crate::operand::{bad, Positions};
use crate::scratch::QueueScratch;
use crate::shaders;
use crate::spec::SpecPipelines;

/// Run-mode dispatches of at most this many query tokens take the decode kernel.
pub const DECODE_MAX_TOKENS: u32 = 8;
/// Most query heads per workgroup (`HB`); larger GQA groups are cut into even chunks.
const MAX_HEADS: u32 = 8;
/// Invocations per workgroup.
const WG: u32 = 128;
/// Most key pieces per (token, KV head, head chunk).
const MAX_SPLIT: u32 = 64;
/// On a GPU, GQA groups are cut into head chunks until there are about this many
/// (token, KV head, head chunk) workgroups before the keys are split.
const HEAD_TARGET: u32 = 32;

/// Whether [`crate::Attention::record`] takes the decode kernel for `a`.
pub(crate) fn applies(a: &AttentionArgs) -> bool {
    a.positions == Positions::Table || a.n_tokens <= DECODE_MAX_TOKENS
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

/// Picks the decode layout for a device and shape. Measured on the H100 (qwen2.5-0.5B decode at
/// position 600: 14 query heads, 2 KV heads, head_dim 64), a workgroup's latency grows with the
/// heads and tiles it walks while a launch costs ~4.5 us however little it does, and merging
/// pieces adds ~3 us; hence:
/// - GPU: with few (token, KV head) pairs, the GQA group is first cut into single heads (more
///   workgroups, each with less serial work), then the keys into pieces of at least
///   `min_chunk` = 64 keys until ~256 workgroups; a context of up to 64 keys is one piece (no
///   merge). Batches of many streams keep whole groups (every K/V row serves all of them).
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
    let n_hc = if cpu {
        1
    } else {
        HEAD_TARGET.div_ceil(pairs.max(1)).clamp(1, group)
    };
    let n_hc = n_hc.max(group.div_ceil(MAX_HEADS));
    let hb = group.div_ceil(n_hc); // even chunks
                                   // lanes per key: the lane's share of the queries (hb * NK4 vec4s) stays <= 32 vec4s
    let lpk = (a.head_dim * hb)
        .div_ceil(128)
        .next_power_of_two()
        .clamp(4, 16)
        .min(sg);
    let nvl = a.head_dim_v.div_ceil(4);
    let kg = floor_pow2(WG / nvl).min(sg);
    let tile = WG / lpk;
    let min_chunk = if cpu { tile } else { tile.max(64) };
    let groups = pairs.saturating_mul(group.div_ceil(hb));
    let target: u32 = if cpu { 8 } else { 256 };
    let split = target
        .div_ceil(groups.max(1))
        .min(a.n_kv_rows.div_ceil(min_chunk))
        .clamp(1, MAX_SPLIT);
    DecodePlan {
        wg: WG,
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
    pipelines: SpecPipelines,
    part: QueueScratch,
    counts: QueueScratch,
}

impl Decode {
    pub(crate) fn new() -> Self {
        Decode {
            pipelines: SpecPipelines::new(shaders::ATTENTION_DECODE, 7, 52, "attention_decode"),
            part: QueueScratch::new("attention_decode_part"),
            counts: QueueScratch::zeroed("attention_decode_count"),
        }
    }

    /// Records `a` with layout `p` (shapes and the layout checked first).
    pub(crate) fn record(&self, chain: &mut Chain, a: &AttentionArgs, p: DecodePlan) -> Result<()> {
        const OP: &str = "attention";
        validate(a)?;
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
        let pipeline = self.pipelines.get(&ctx, spec)?;
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
        let push = Push::new()
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
            .u32(p.min_chunk);
        let groups = n_counts * u64::from(p.split);
        chain.dispatch(
            &pipeline,
            &[
                a.q.clone(),
                a.k.clone(),
                a.v.clone(),
                a.out.clone(),
                a.pos.clone(),
                part,
                counts,
            ],
            &push,
            grid(groups, OP)?,
        )?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "attention_decode_tests.rs"]
mod tests;
