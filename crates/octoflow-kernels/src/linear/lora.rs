//! LoRA adapters applied at inference (shaders `lora_shrink.comp`, `lora_expand.comp`): several
//! adapters of one projection at once (llama.cpp `--lora-scaled`), each token of a batch with its
//! own mix of them (S-LoRA/punica "BGMV" serving):
//!
//! ```text
//! y[t, y_col + j] += Σ_a s(t, a) · Σ_{r in adapter a} B[j, r] · Σ_k A[r, k] · x[t, k]
//! s(t, a) = scales[mix[mix_offset + t * mix_stride] * n_adapters + a]
//! ```
//!
//! The adapters are stacked ([`LoraStack`]): adapter `a` owns rank rows
//! `offsets[a] .. offsets[a + 1]` of `A` and the same columns of `B` (a rank may be 0). Two
//! dispatches, recorded by the caller with a compute barrier between them:
//!
//! 1. [`Lora::record_shrink`]: `t[tok, r] = s(tok, adapter_of(r)) · Σ_k A[r, k] · x[tok, k]`;
//!    a row whose scale is exactly 0 is written as 0 without reading `A`.
//! 2. [`Lora::record_expand`]: `y[tok, y_col + j] += Σ_r B[j, r] · t[tok, r]`, skipping the rank
//!    columns of adapters whose scale for that token is 0 (their `B` columns are not read).
//!
//! So a batch of sequences using a few of many loaded adapters only pays for the ones it uses.
//! A scale of exactly 0 means "adapter absent": its `A`/`B` values never matter, even NaN.
//!
//! Mix ids are data the host does not see: an id `>= n_mix` is undefined behaviour of the
//! kernels (the shaders clamp it, so nothing is read out of bounds, but the result is
//! unspecified); [`lora_ref`] returns an error for it. Likewise `offsets` must be nondecreasing
//! with `offsets[0] = 0` and `offsets[n_adapters] = r_total` (checked by [`lora_ref`] only).

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

const OP: &str = "lora";

/// The largest `r_total` the kernels take (`t` rows are staged in shared memory by the expand).
pub const MAX_RANK: u32 = 256;

/// Rank rows per shrink workgroup (`ROWS` of `lora_shrink` in variants.txt).
const SHRINK_ROWS: u32 = 4;
/// Output columns and tokens per expand workgroup (`JB`, `TOKS` of `lora_expand`).
const EXPAND_COLS: u32 = 64;
const EXPAND_TOKENS: u32 = 4;

/// Bytes of the push-constant blocks: 8 u32 (shrink), 9 u32 (expand).
const SHRINK_PUSH: u32 = 32;
const EXPAND_PUSH: u32 = 36;

/// The stacked adapters of one projection.
pub struct LoraStack<'a> {
    /// `[r_total, n_in]` f32 row-major: adapter 0's A rows (rank r_0), then adapter 1's, ...
    pub a: &'a BufferSlice,
    /// `[n_out, r_total]` f32 row-major: row j holds adapter 0's `B[j, 0..r_0]`, then adapter 1's,
    /// ... (alpha / rank already folded in).
    pub b: &'a BufferSlice,
    /// `[n_adapters + 1]` u32: prefix sums of the ranks (`offsets[0] = 0`,
    /// `offsets[n_adapters] = r_total`, nondecreasing: a rank may be 0).
    pub offsets: &'a BufferSlice,
    /// Number of stacked adapters (>= 1).
    pub n_adapters: u32,
    /// Sum of the ranks, 1..=[`MAX_RANK`].
    pub r_total: u32,
    /// Input features (columns of A).
    pub n_in: u32,
    /// Output features (rows of B).
    pub n_out: u32,
}

/// Which adapters each token uses, and how strongly.
pub struct LoraMix<'a> {
    /// `[n_mix, n_adapters]` f32: the scale of adapter `a` in mix `m`; 0 means the adapter is off.
    pub scales: &'a BufferSlice,
    /// Number of mixes (>= 1).
    pub n_mix: u32,
    /// u32 mix ids: token `t` uses mix `mix[mix_offset + t * mix_stride]` (must be `< n_mix`).
    pub mix: &'a BufferSlice,
    /// Element index of token 0's mix id in `mix`.
    pub mix_offset: u32,
    /// Elements between consecutive tokens' mix ids; 0: one mix for every token.
    pub mix_stride: u32,
}

/// Both LoRA pipelines (shrink and expand), built once per device.
pub struct Lora {
    shrink: Pipeline,
    expand: Pipeline,
}

/// `(count - 1) * stride + last + 1` elements: the span a strided operand must hold.
fn span(count: u32, stride: u32, last: u128) -> u128 {
    u128::from(count - 1) * u128::from(stride) + last
}

/// Checks what both steps share: nonzero sizes, the rank limit, offsets, scales, mix ids, t.
fn check_common(s: &LoraStack, m: &LoraMix, t: &BufferSlice, n_tokens: u32) -> Result<()> {
    let dims = [
        ("n_adapters", s.n_adapters),
        ("r_total", s.r_total),
        ("n_in", s.n_in),
        ("n_out", s.n_out),
        ("n_mix", m.n_mix),
        ("n_tokens", n_tokens),
    ];
    if let Some((name, _)) = dims.iter().find(|(_, v)| *v == 0) {
        return Err(bad(OP, format!("{name} is 0 ({dims:?})")));
    }
    if s.r_total > MAX_RANK {
        let detail = format!("r_total {} exceeds the maximum {MAX_RANK}", s.r_total);
        return Err(bad(OP, detail));
    }
    need(OP, "offsets", s.offsets, u128::from(s.n_adapters) + 1)?;
    need(
        OP,
        "scales",
        m.scales,
        u128::from(m.n_mix) * u128::from(s.n_adapters),
    )?;
    need(
        OP,
        "mix",
        m.mix,
        span(n_tokens, m.mix_stride, u128::from(m.mix_offset) + 1),
    )?;
    need(OP, "t", t, u128::from(n_tokens) * u128::from(s.r_total))?;
    Ok(())
}

/// Workgroup counts `[x, y, 1]`, or a shape error beyond the device's limits.
fn grid(chain: &Chain, x: u32, y: u32) -> Result<[u32; 3]> {
    let max = chain.context().caps().max_workgroup_count;
    if x > max[0] || y > max[1] {
        let detail = format!(
            "{x}x{y} workgroups exceed the device's {}x{}",
            max[0], max[1]
        );
        return Err(bad(OP, detail));
    }
    Ok([x, y, 1])
}

impl Lora {
    /// Builds both pipelines.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Lora {
            shrink: Pipeline::new(
                ctx,
                &PipelineDesc::new(shaders::LORA_SHRINK, 6, SHRINK_PUSH),
            )?,
            expand: Pipeline::new(
                ctx,
                &PipelineDesc::new(shaders::LORA_EXPAND, 6, EXPAND_PUSH),
            )?,
        })
    }

    /// Records `t = scaled A·x` for `n_tokens` tokens: `t[tok * r_total + r] = s(tok, a) ·
    /// Σ_k A[r, k] · x[tok * x_stride + k]`, with `a` the adapter owning rank row `r`; a row
    /// whose scale is 0 is written as 0 and `A` is not read for it.
    ///
    /// `x`: f32 rows of stride `x_stride >= n_in` floats; `t`: `[n_tokens, r_total]` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn record_shrink(
        &self,
        chain: &mut Chain,
        s: &LoraStack,
        m: &LoraMix,
        x: &BufferSlice,
        x_stride: u32,
        t: &BufferSlice,
        n_tokens: u32,
    ) -> Result<()> {
        check_common(s, m, t, n_tokens)?;
        if x_stride < s.n_in {
            let detail = format!("x_stride {x_stride} < n_in {}", s.n_in);
            return Err(bad(OP, detail));
        }
        need(OP, "a", s.a, u128::from(s.r_total) * u128::from(s.n_in))?;
        need(OP, "x", x, span(n_tokens, x_stride, u128::from(s.n_in)))?;
        let groups = grid(chain, s.r_total.div_ceil(SHRINK_ROWS), n_tokens)?;
        let push = Push::new()
            .u32(s.r_total)
            .u32(s.n_in)
            .u32(s.n_adapters)
            .u32(m.n_mix)
            .u32(m.mix_offset)
            .u32(m.mix_stride)
            .u32(x_stride)
            .u32(n_tokens);
        let bindings = [
            s.a.clone(),
            x.clone(),
            t.clone(),
            s.offsets.clone(),
            m.scales.clone(),
            m.mix.clone(),
        ];
        chain.dispatch(&self.shrink, &bindings, &push, groups)?;
        Ok(())
    }

    /// Records `y += B·t` for `n_tokens` tokens: `y[tok * y_stride + y_col + j] += Σ_r B[j, r] ·
    /// t[tok * r_total + r]` for `j < n_out`, where `r` runs over the rank columns of the
    /// adapters whose scale for `tok` is nonzero (the others' `B` columns are not used).
    ///
    /// `t`: `[n_tokens, r_total]` f32 (from [`Lora::record_shrink`], after a compute barrier);
    /// `y`: f32 rows of stride `y_stride`, written in columns `y_col .. y_col + n_out`
    /// (`y_col + n_out <= y_stride`); the other columns are untouched.
    #[allow(clippy::too_many_arguments)]
    pub fn record_expand(
        &self,
        chain: &mut Chain,
        s: &LoraStack,
        m: &LoraMix,
        t: &BufferSlice,
        y: &BufferSlice,
        y_stride: u32,
        y_col: u32,
        n_tokens: u32,
    ) -> Result<()> {
        check_common(s, m, t, n_tokens)?;
        if u64::from(y_col) + u64::from(s.n_out) > u64::from(y_stride) {
            let detail = format!("y_col {y_col} + n_out {} > y_stride {y_stride}", s.n_out);
            return Err(bad(OP, detail));
        }
        need(OP, "b", s.b, u128::from(s.n_out) * u128::from(s.r_total))?;
        need(
            OP,
            "y",
            y,
            span(n_tokens, y_stride, u128::from(y_col) + u128::from(s.n_out)),
        )?;
        let groups = grid(
            chain,
            s.n_out.div_ceil(EXPAND_COLS),
            n_tokens.div_ceil(EXPAND_TOKENS),
        )?;
        let push = Push::new()
            .u32(s.r_total)
            .u32(s.n_out)
            .u32(s.n_adapters)
            .u32(m.n_mix)
            .u32(m.mix_offset)
            .u32(m.mix_stride)
            .u32(y_stride)
            .u32(y_col)
            .u32(n_tokens);
        let bindings = [
            s.b.clone(),
            t.clone(),
            y.clone(),
            s.offsets.clone(),
            m.scales.clone(),
            m.mix.clone(),
        ];
        chain.dispatch(&self.expand, &bindings, &push, groups)?;
        Ok(())
    }
}

/// Checks that slice `name` holds at least `len` values.
fn need_len(name: &str, have: usize, len: usize) -> Result<()> {
    if have < len {
        return Err(bad(OP, format!("{name} holds {have} values, needs {len}")));
    }
    Ok(())
}

/// CPU reference of both steps together (f64 sums, f32 result):
/// `y[t * y_stride + y_col + j] += Σ_a s(t, a) · Σ_{r = offsets[a]}^{offsets[a+1]-1} b[j * r_total + r]
/// · Σ_k a[r * n_in + k] · x[t * x_stride + k]`, with `s(t, a) = scales[mix[mix_offset + t *
/// mix_stride] * n_adapters + a]` and `n_adapters = offsets.len() - 1`, `r_total =
/// offsets[n_adapters]`. Adapters with scale exactly 0 are skipped (their values never matter).
/// Errors on a mix id `>= n_mix`, malformed offsets, or operands too short.
#[allow(clippy::too_many_arguments)]
pub fn lora_ref(
    a: &[f32],
    b: &[f32],
    offsets: &[u32],
    n_in: usize,
    n_out: usize,
    scales: &[f32],
    n_mix: usize,
    mix: &[u32],
    mix_offset: usize,
    mix_stride: usize,
    x: &[f32],
    x_stride: usize,
    y: &mut [f32],
    y_stride: usize,
    y_col: usize,
    n_tokens: usize,
) -> Result<()> {
    let (Some(&first), Some(&last)) = (offsets.first(), offsets.last()) else {
        return Err(bad(OP, "offsets is empty".into()));
    };
    if first != 0 || offsets.windows(2).any(|w| w[0] > w[1]) {
        return Err(bad(
            OP,
            format!("offsets {offsets:?} are not prefix sums from 0"),
        ));
    }
    let n_adapters = offsets.len() - 1;
    let r_total = last as usize;
    if y_col + n_out > y_stride || x_stride < n_in {
        let detail = format!("y_col {y_col} + n_out {n_out} > y_stride {y_stride} or x_stride {x_stride} < n_in {n_in}");
        return Err(bad(OP, detail));
    }
    need_len("a", a.len(), r_total * n_in)?;
    need_len("b", b.len(), n_out * r_total)?;
    need_len("scales", scales.len(), n_mix * n_adapters)?;
    if n_tokens == 0 {
        return Ok(());
    }
    need_len(
        "mix",
        mix.len(),
        mix_offset + (n_tokens - 1) * mix_stride + 1,
    )?;
    need_len("x", x.len(), (n_tokens - 1) * x_stride + n_in)?;
    need_len("y", y.len(), (n_tokens - 1) * y_stride + y_col + n_out)?;
    for t in 0..n_tokens {
        let m = mix[mix_offset + t * mix_stride] as usize;
        if m >= n_mix {
            return Err(bad(OP, format!("token {t}: mix id {m} >= n_mix {n_mix}")));
        }
        let xt = &x[t * x_stride..t * x_stride + n_in];
        let mut delta = vec![0f64; n_out];
        for ad in 0..n_adapters {
            let s = f64::from(scales[m * n_adapters + ad]);
            if s == 0.0 {
                continue;
            }
            for r in offsets[ad] as usize..offsets[ad + 1] as usize {
                let ar = &a[r * n_in..(r + 1) * n_in];
                let h: f64 = ar
                    .iter()
                    .zip(xt)
                    .map(|(&w, &v)| f64::from(w) * f64::from(v))
                    .sum();
                for (j, d) in delta.iter_mut().enumerate() {
                    *d += f64::from(b[j * r_total + r]) * s * h;
                }
            }
        }
        let yt = &mut y[t * y_stride + y_col..t * y_stride + y_col + n_out];
        for (o, d) in yt.iter_mut().zip(delta) {
            *o = (f64::from(*o) + d) as f32;
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "lora_tests.rs"]
mod tests;
