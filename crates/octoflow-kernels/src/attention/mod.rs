//! Causal attention over a KV cache (shader `attention.comp`): grouped KV heads, optional sliding
//! window, positions read from a GPU buffer, streaming (online) softmax over the keys. Decode
//! steps (few query tokens per sequence) take `attention_decode.comp` instead (see
//! `attention_decode.rs`); runs of more tokens take `attention_coop.comp` where the device has
//! cooperative matrices and the heads are 64 or 128 wide (see `attention_coop.rs`).
//!
//! # The attention family
//!
//! This folder holds the attention kernels (prefill, cooperative-matrix prefill, decode, the
//! merge of split pieces) and the ops that prepare their operands: RoPE, RoPE fused with the
//! KV-cache write, the KV-cache write itself and the plain softmax. Shaders: `shaders/attention/`.

pub(crate) mod attention_coop;
pub(crate) mod attention_decode;
pub mod kv_type;
pub mod page;
pub mod rope;
pub mod rope_store;
pub mod set_rows;
pub mod soft_max;

use octoflow_vk::{
    BufferSlice, Chain, Context, DeviceCaps, DeviceKind, Pipeline, PipelineDesc, Push,
};

use crate::attention_coop::AttentionCoop;
use crate::error::Result;
use crate::operand::{bad, need, need_kv, Positions};
use crate::scratch::QueueScratch;
use crate::shaders;
use crate::spec::SpecPipelines;
use attention_decode::{Decode, FreshKv};
use kv_type::{KvType, PerKv};

/// Largest `head_dim` / `head_dim_v` (`MAX_D` in `attention.comp`).
pub const MAX_HEAD_DIM: u32 = 256;

/// Operands of one attention dispatch.
pub struct AttentionArgs<'a> {
    /// `[n_tokens, n_head, head_dim]` f32 (after RoPE).
    pub q: &'a BufferSlice,
    /// Key cache `[n_kv_rows, n_head_kv, head_dim]` of `kv`.
    pub k: &'a BufferSlice,
    /// Value cache `[n_kv_rows, n_head_kv, head_dim_v]` of `kv`.
    pub v: &'a BufferSlice,
    /// Element type of both caches.
    pub kv: KvType,
    /// `[n_tokens, n_head, head_dim_v]` f32.
    pub out: &'a BufferSlice,
    /// Queries.
    pub n_tokens: u32,
    /// Query heads (a multiple of `n_head_kv`).
    pub n_head: u32,
    /// KV heads; query head `h` reads KV head `h / (n_head / n_head_kv)`.
    pub n_head_kv: u32,
    /// Width of a query/key head (at most [`MAX_HEAD_DIM`]).
    pub head_dim: u32,
    /// Width of a value head (at most [`MAX_HEAD_DIM`]).
    pub head_dim_v: u32,
    /// Cache capacity in rows (bounds; positions `>=` it are never read).
    pub n_kv_rows: u32,
    /// 0: none; else the query at `p` sees keys `j` with `p - j < window`.
    pub window: u32,
    /// Factor on `q . k` before the softmax.
    pub scale: f32,
    /// u32 buffer; query `t` is at position `p = pos[pos_offset] + t` and sees keys
    /// `j` in `[first, p]` (`first = p + 1 - window` when windowed, else 0).
    pub pos: &'a BufferSlice,
    /// Index of the start position in `pos`.
    pub pos_offset: u32,
    /// How `pos` is read. With [`Positions::Table`], key `j` of query `t`'s sequence is row
    /// `pos[pos_offset + 2t + 1] + j` of `k` and `v` (which then hold several sequences), and
    /// `n_kv_rows` is the capacity of one sequence.
    pub positions: Positions,
    /// `[n_head]` f32 sink logits (gpt-oss's `attn_sinks`), or none: query head `h`'s softmax
    /// denominator also counts `exp(sinks[h])`, a column with no value (llama.cpp's `soft_max`
    /// with sinks).
    pub sinks: Option<&'a BufferSlice>,
}

impl AttentionArgs<'_> {
    /// The bindings of the prefill kernels (`attention.comp`, `attention_coop.comp`): q, k, v,
    /// out, pos, the split-K scratch `part` and the sinks.
    pub(crate) fn bindings(&self, part: &BufferSlice) -> [BufferSlice; 7] {
        [
            self.q.clone(),
            self.k.clone(),
            self.v.clone(),
            self.out.clone(),
            self.pos.clone(),
            part.clone(),
            self.sinks_binding().clone(),
        ]
    }

    /// The sinks, or a valid binding that is never read without them.
    pub(crate) fn sinks_binding(&self) -> &BufferSlice {
        self.sinks.unwrap_or(self.q)
    }

    /// The kernels' `has_sinks` flag.
    pub(crate) fn has_sinks(&self) -> u32 {
        u32::from(self.sinks.is_some())
    }
}

/// Work layout of one attention dispatch: the specialization of `attention.comp` plus the
/// split-K factor (see the shader's header comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Plan {
    /// Invocations per workgroup (a multiple of `cl`).
    pub wg: u32,
    /// Lanes per cluster (a power of two, at most the subgroup size).
    pub cl: u32,
    /// Query heads per cluster.
    pub hpl: u32,
    /// Tokens per cluster.
    pub tpl: u32,
    /// Key-range pieces (1: no merge pass).
    pub split: u32,
}

/// The attention kernel, built once per device. Pipelines for each head shape are specialized
/// on first use; split-K scratch memory is allocated on first use, per queue, and grows as needed
/// (see `scratch.rs`).
pub struct Attention {
    pipelines: PerKv<SpecPipelines>,
    merge: Pipeline,
    scratch: QueueScratch,
    /// The one-dispatch decode kernel.
    pub(crate) decode: Decode,
    /// Runs on cooperative matrices, where the device has them.
    coop: Option<AttentionCoop>,
}

impl Attention {
    /// Builds the merge pipeline (the main one is specialized per head shape on first use).
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Attention {
            pipelines: PerKv {
                f32: SpecPipelines::new(shaders::ATTENTION, 7, 52, "attention"),
                f16: SpecPipelines::new(shaders::ATTENTION_KV16, 7, 52, "attention_kv16"),
                q8: SpecPipelines::new(shaders::ATTENTION_KVQ8, 7, 52, "attention_kvq8"),
            },
            merge: Pipeline::new(
                ctx,
                &PipelineDesc::new(shaders::ATTENTION_MERGE, 3, 20).label("attention_merge"),
            )?,
            scratch: QueueScratch::new("attention_split"),
            decode: Decode::new(),
            coop: AttentionCoop::new(ctx)?,
        })
    }

    /// The split-K scratch and merge pipeline (tests of the cooperative-matrix path).
    #[cfg(test)]
    pub(crate) fn split_parts(&self) -> (&QueueScratch, &Pipeline) {
        (&self.scratch, &self.merge)
    }

    /// This kernel without its cooperative-matrix path (tests of `attention.comp`).
    #[cfg(test)]
    pub(crate) fn without_coop(mut self) -> Self {
        self.coop = None;
        self
    }

    /// Records attention of every query token and head, keys streamed with an online softmax,
    /// so any context length works. Decode steps (a position table, or a run of at most
    /// [`attention_decode::DECODE_MAX_TOKENS`] tokens) take one dispatch of the decode kernel,
    /// which splits the key range across workgroups and merges the pieces in the same dispatch
    /// (flash decoding); longer runs (prefill) take `attention_coop.comp` where it applies (f16
    /// operands on tensor cores), else `attention.comp`, whose clusters share every key and
    /// value row among several tokens, with a merge dispatch after an internal barrier when it
    /// splits the keys.
    pub fn record(&self, chain: &mut Chain, a: &AttentionArgs) -> Result<()> {
        let caps = chain.context().caps();
        if attention_decode::applies(a) {
            let p = attention_decode::plan(caps, a);
            return self.decode.record(chain, a, p);
        }
        if let Some(coop) = &self.coop {
            if AttentionCoop::applies(a) {
                return coop.record(chain, a, 0, &self.scratch, &self.merge);
            }
        }
        let plan = plan(caps, a);
        self.record_plan(chain, a, plan)
    }

    /// Records a decode step's attention over its own keys and values before they are stored:
    /// `a.q` is the raw query, `a.k` / `a.v` the caches, `f` the step's raw keys and values and
    /// how they are normed and rotated; the step's keys and values are written into the caches
    /// in the same dispatch (see [`FreshKv`]). For runs where
    /// [`attention_decode::fresh_applies`] holds.
    pub fn record_fresh(&self, chain: &mut Chain, a: &AttentionArgs, f: &FreshKv) -> Result<()> {
        let p = attention_decode::plan(chain.context().caps(), a);
        self.decode.record_fresh(chain, a, f, p)
    }

    /// [`Attention::record`] with an explicit work layout (tests use it to cover every path).
    pub(crate) fn record_plan(&self, chain: &mut Chain, a: &AttentionArgs, p: Plan) -> Result<()> {
        const OP: &str = "attention";
        validate(a)?;
        let ctx = chain.context().clone();
        let aligned = a.head_dim.is_multiple_of(4) && a.head_dim_v.is_multiple_of(4);
        let spec = [
            p.wg,
            p.cl,
            a.head_dim.div_ceil(4 * p.cl),
            a.head_dim_v.div_ceil(4 * p.cl),
            p.hpl,
            p.tpl,
            u32::from(aligned),
        ];
        let pipeline = self.pipelines.get(OP, ctx.caps(), a.kv)?.get(&ctx, spec)?;
        if a.positions == Positions::Table && p.tpl != 1 {
            return Err(bad(
                OP,
                "a position table needs one token per cluster".to_string(),
            ));
        }
        let part = split_parts(chain, &self.scratch, a, p.split)?;
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
            .u32(a.has_sinks());
        let group = a.n_head / a.n_head_kv;
        let clusters = u64::from(a.n_tokens.div_ceil(p.tpl))
            * u64::from(group.div_ceil(p.hpl))
            * u64::from(a.n_head_kv)
            * u64::from(p.split);
        let groups = clusters.div_ceil(u64::from(p.wg / p.cl));
        chain.dispatch(&pipeline, &a.bindings(&part), &push, grid(groups, OP)?)?;
        merge_parts(chain, &self.merge, a, part, p.split)?;
        Ok(())
    }
}

/// Scratch for the partial results of `a`'s queries in `split` key pieces (unnormalized
/// accumulators, then (m, l) pairs: `attention_merge.comp`'s layout), or `a.out` itself (never
/// written then) for one piece.
pub(crate) fn split_parts(
    chain: &Chain,
    scratch: &QueueScratch,
    a: &AttentionArgs,
    split: u32,
) -> Result<BufferSlice> {
    if split <= 1 {
        return Ok(a.out.clone());
    }
    let rows = u64::from(a.n_tokens) * u64::from(a.n_head);
    let bytes = 4 * rows * u64::from(split) * (u64::from(a.head_dim_v) + 2);
    scratch.get_slice(chain, bytes)
}

/// After a barrier, `merge` (`attention_merge.comp`) combines the `split` pieces in `part` into
/// `a.out`; nothing for one piece.
pub(crate) fn merge_parts(
    chain: &mut Chain,
    merge: &Pipeline,
    a: &AttentionArgs,
    part: BufferSlice,
    split: u32,
) -> Result<()> {
    if split <= 1 {
        return Ok(());
    }
    let rows = u64::from(a.n_tokens) * u64::from(a.n_head);
    chain.compute_barrier()?;
    let push = Push::new()
        .u32(rows as u32)
        .u32(a.head_dim_v)
        .u32(split)
        .u32(a.n_head)
        .u32(a.has_sinks());
    chain.dispatch(
        merge,
        &[part, a.out.clone(), a.sinks_binding().clone()],
        &push,
        grid(rows, "attention")?,
    )?;
    Ok(())
}

/// Rows the caches hold (the bound on table-mode reads).
pub(crate) fn kv_total(a: &AttentionArgs) -> u32 {
    let row = |width: u32| {
        a.kv.bytes_for(u64::from(a.n_head_kv) * u64::from(width))
            .max(1)
    };
    (a.k.size / row(a.head_dim))
        .min(a.v.size / row(a.head_dim_v))
        .min(u64::from(u32::MAX)) as u32
}

/// A 2-D grid of at least `groups` workgroups (x at most 65535).
pub(crate) fn grid(groups: u64, op: &'static str) -> Result<[u32; 3]> {
    let x = groups.clamp(1, 65535);
    let y = groups.div_ceil(x);
    if y > 65535 {
        return Err(bad(op, format!("{groups} workgroups are too many")));
    }
    Ok([x as u32, y as u32, 1])
}

/// Picks the work layout for a device and shape.
pub(crate) fn plan(caps: &DeviceCaps, a: &AttentionArgs) -> Plan {
    let cpu = caps.kind == DeviceKind::Cpu;
    let sg = caps.subgroup.size.clamp(1, 32);
    let hd = a.head_dim.max(a.head_dim_v);
    // lanes per cluster: enough that a lane holds at most 2 vec4s of a row (GPU registers);
    // on a CPU (SIMD lanes, every load per lane) only the register count matters.
    let cl = if cpu {
        8.min(sg)
    } else {
        hd.div_ceil(8).next_power_of_two().min(sg)
    };
    let n4 = hd.div_ceil(4 * cl);
    let group = a.n_head / a.n_head_kv;
    // queries per cluster bounded by the registers they take (q and acc vec4s per query)
    let budget = if cpu { 96 } else { 48 };
    let per_q = 2 * n4;
    let tpl = if cpu && a.n_tokens > 1 && a.positions == Positions::Run {
        2
    } else {
        1
    };
    let hpl_max = group.min((budget / (per_q * tpl)).max(1));
    let hpl = group.div_ceil(group.div_ceil(hpl_max)); // even chunks of the GQA group
    let tpl = tpl.min((budget / (per_q * hpl)).max(1));
    let wg = if cpu { 32.max(cl) } else { 64.max(cl) };
    let clusters = a.n_tokens.div_ceil(tpl) * group.div_ceil(hpl) * a.n_head_kv;
    // split the keys while there are too few clusters to fill the device, in pieces of at least
    // ~20 keys (shorter pieces cost more to merge than they save)
    let target = if cpu { 16 * (wg / cl) } else { 65536 / cl };
    let split = target
        .div_ceil(clusters.max(1))
        .min(a.n_kv_rows.div_ceil(20))
        .clamp(1, 64);
    Plan {
        wg,
        cl,
        hpl,
        tpl,
        split,
    }
}

/// Shape and slice checks.
pub(crate) fn validate(a: &AttentionArgs) -> Result<()> {
    const OP: &str = "attention";
    if a.n_tokens == 0 || a.n_head == 0 || a.n_head_kv == 0 || a.n_kv_rows == 0 {
        return Err(bad(
            OP,
            format!(
                "empty shape: {} tokens, {} heads, {} kv heads, {} kv rows",
                a.n_tokens, a.n_head, a.n_head_kv, a.n_kv_rows
            ),
        ));
    }
    if !a.n_head.is_multiple_of(a.n_head_kv) {
        return Err(bad(
            OP,
            format!(
                "n_head {} is not a multiple of n_head_kv {}",
                a.n_head, a.n_head_kv
            ),
        ));
    }
    for (name, d) in [("head_dim", a.head_dim), ("head_dim_v", a.head_dim_v)] {
        if d == 0 || d > MAX_HEAD_DIM {
            return Err(bad(OP, format!("{name} {d} not in 1..={MAX_HEAD_DIM}")));
        }
    }
    a.kv.check_heads(a.head_dim as usize, a.head_dim_v as usize)
        .map_err(|e| bad(OP, e))?;
    let (t, h, hk) = (
        u128::from(a.n_tokens),
        u128::from(a.n_head),
        u128::from(a.n_head_kv),
    );
    let rows = u128::from(a.n_kv_rows);
    need(OP, "q", a.q, t * h * u128::from(a.head_dim))?;
    need_kv(OP, "k", a.k, rows * hk * u128::from(a.head_dim), a.kv)?;
    need_kv(OP, "v", a.v, rows * hk * u128::from(a.head_dim_v), a.kv)?;
    need(OP, "out", a.out, t * h * u128::from(a.head_dim_v))?;
    need(
        OP,
        "pos",
        a.pos,
        u128::from(a.pos_offset) + a.positions.words(a.n_tokens),
    )?;
    if let Some(sinks) = a.sinks {
        need(OP, "sinks", sinks, h)?;
    }
    Ok(())
}

/// Shape of a reference attention call (the same meaning as the [`AttentionArgs`] fields).
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape<'a> {
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Query/key head width.
    pub head_dim: usize,
    /// Value head width.
    pub head_dim_v: usize,
    /// Cache rows.
    pub n_kv_rows: usize,
    /// 0: no window.
    pub window: usize,
    /// Factor on `q . k`.
    pub scale: f32,
    /// `[n_head]` sink logits, or none.
    pub sinks: Option<&'a [f32]>,
}

/// CPU reference: `q` `[n_tokens, n_head, head_dim]`, caches `k`, `v` `[n_kv_rows, n_head_kv, _]`,
/// `out` `[n_tokens, n_head, head_dim_v]`; query `t` at position `start + t` sees keys
/// `first..=min(p, n_kv_rows - 1)`; scores, max-subtracted softmax and weighted value sum as
/// `octoflow-model`'s attention, but accumulated in f64 so that the oracle's own rounding does
/// not count against a kernel that sums in another order; with sinks, `exp(sinks[h] - max)` joins
/// head `h`'s denominator. A query that sees no key gets zeros.
pub fn attention_ref(
    s: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    start: usize,
    out: &mut [f32],
) {
    attention_ref_rounded(s, q, k, v, start, out, None, f64::from, |w| w);
}

/// [`attention_ref`] with the operands q, k, v passed through `round` and the softmax weights
/// exp(s - max) through `round_w` before their products (the kernels that multiply rounded
/// values have their reference here); with `mag`, also each output's magnitude Σ w · |v| / Σ w.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_ref_rounded(
    s: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    start: usize,
    out: &mut [f32],
    mut mag: Option<&mut [f32]>,
    round: impl Fn(f32) -> f64,
    round_w: impl Fn(f64) -> f64,
) {
    let (hd, hv) = (s.head_dim, s.head_dim_v);
    let group = s.n_head / s.n_head_kv;
    for (i, o) in out.chunks_exact_mut(hv).enumerate() {
        let (t, h) = (i / s.n_head, i % s.n_head);
        let p = start + t;
        let first = if s.window > 0 {
            (p + 1).saturating_sub(s.window)
        } else {
            0
        };
        let end = (p + 1).min(s.n_kv_rows);
        let kvh = h / group;
        let qh = &q[i * hd..][..hd];
        let scores: Vec<f64> = (first..end)
            .map(|j| {
                let kh = &k[(j * s.n_head_kv + kvh) * hd..][..hd];
                let dot: f64 = qh.iter().zip(kh).map(|(&a, &b)| round(a) * round(b)).sum();
                f64::from(s.scale) * dot
            })
            .collect();
        let sink = s.sinks.map(|k| f64::from(k[h]));
        let max = scores
            .iter()
            .copied()
            .chain(sink.filter(|_| !scores.is_empty()))
            .fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = scores.iter().chain(&sink).map(|&x| (x - max).exp()).sum();
        let mut acc = vec![0f64; hv];
        let mut abs = vec![0f64; hv];
        for (j, &x) in (first..end).zip(&scores) {
            let w = round_w((x - max).exp());
            let vh = &v[(j * s.n_head_kv + kvh) * hv..][..hv];
            for ((a, b), &y) in acc.iter_mut().zip(abs.iter_mut()).zip(vh) {
                *a += w * round(y);
                *b += w * round(y).abs();
            }
        }
        let norm = |a: f64| if sum > 0.0 { (a / sum) as f32 } else { 0.0 };
        for (x, a) in o.iter_mut().zip(&acc) {
            *x = norm(*a);
        }
        if let Some(mag) = mag.as_deref_mut() {
            for (x, b) in mag[i * hv..][..hv].iter_mut().zip(&abs) {
                *x = norm(*b);
            }
        }
    }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
