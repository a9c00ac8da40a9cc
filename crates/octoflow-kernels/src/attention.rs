//! Causal attention over a KV cache (shader `attention.comp`): grouped KV heads, optional sliding
//! window, positions read from a GPU buffer, streaming (online) softmax over the keys.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

/// Largest `head_dim` / `head_dim_v` (`MAX_D` in `attention.comp`).
pub const MAX_HEAD_DIM: u32 = 256;

/// Operands of one attention dispatch.
pub struct AttentionArgs<'a> {
    /// `[n_tokens, n_head, head_dim]` f32 (after RoPE).
    pub q: &'a BufferSlice,
    /// Key cache `[n_kv_rows, n_head_kv, head_dim]` f32.
    pub k: &'a BufferSlice,
    /// Value cache `[n_kv_rows, n_head_kv, head_dim_v]` f32.
    pub v: &'a BufferSlice,
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
}

/// The attention kernel, built once per device.
pub struct Attention {
    pipeline: Pipeline,
}

impl Attention {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Attention {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::ATTENTION, 5, 36))?,
        })
    }

    /// Records attention of every query token and head: one workgroup per (head, token), keys
    /// streamed in chunks with an online softmax, so any context length works.
    pub fn record(&self, chain: &mut Chain, a: &AttentionArgs) -> Result<()> {
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
        let (t, h, hk) = (
            u128::from(a.n_tokens),
            u128::from(a.n_head),
            u128::from(a.n_head_kv),
        );
        let rows = u128::from(a.n_kv_rows);
        need(OP, "q", a.q, t * h * u128::from(a.head_dim))?;
        need(OP, "k", a.k, rows * hk * u128::from(a.head_dim))?;
        need(OP, "v", a.v, rows * hk * u128::from(a.head_dim_v))?;
        need(OP, "out", a.out, t * h * u128::from(a.head_dim_v))?;
        need(OP, "pos", a.pos, u128::from(a.pos_offset) + 1)?;
        let push = Push::new()
            .u32(a.n_tokens)
            .u32(a.n_head)
            .u32(a.n_head_kv)
            .u32(a.head_dim)
            .u32(a.head_dim_v)
            .u32(a.n_kv_rows)
            .u32(a.window)
            .u32(a.pos_offset)
            .f32(a.scale);
        chain.dispatch(
            &self.pipeline,
            &[
                a.q.clone(),
                a.k.clone(),
                a.v.clone(),
                a.out.clone(),
                a.pos.clone(),
            ],
            &push,
            [a.n_head, a.n_tokens, 1],
        )?;
        Ok(())
    }
}

/// Shape of a reference attention call (the same meaning as the [`AttentionArgs`] fields).
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
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
}

/// CPU reference: `q` `[n_tokens, n_head, head_dim]`, caches `k`, `v` `[n_kv_rows, n_head_kv, _]`,
/// `out` `[n_tokens, n_head, head_dim_v]`; query `t` at position `start + t` sees keys
/// `first..=min(p, n_kv_rows - 1)`; f32 scores, max-subtracted f32 softmax, weighted value sum
/// (as `octoflow-model`'s attention). A query that sees no key gets zeros.
pub fn attention_ref(
    s: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    start: usize,
    out: &mut [f32],
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
        let mut att: Vec<f32> = (first..end)
            .map(|j| {
                let kh = &k[(j * s.n_head_kv + kvh) * hd..][..hd];
                s.scale * qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>()
            })
            .collect();
        let max = att.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for a in att.iter_mut() {
            *a = (*a - max).exp();
            sum += *a;
        }
        o.fill(0.0);
        for (j, a) in (first..end).zip(&att) {
            let vh = &v[(j * s.n_head_kv + kvh) * hv..][..hv];
            for (x, y) in o.iter_mut().zip(vh) {
                *x += a / sum * y;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::check_close;
    use crate::operand::test_bufs::{poisoned, read, with};

    /// f32 dot products over up to 256 dims and a softmax over up to ~600 keys, summed in a
    /// different order (chunked online rescaling) than the reference: a few 1e-6 typical,
    /// 1e-4 bound (outputs near zero are judged against 1% of the largest).
    const REL: f32 = 1e-4;

    #[test]
    fn gpu_attention_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("gpu_attention_matches_the_reference") else {
            return;
        };
        let seed: u64 = rand::random();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let k = Attention::new(&ctx).unwrap();
        // (n_tokens, n_head, n_head_kv, head_dim, head_dim_v, n_kv_rows, window, start)
        let cases = [
            (1, 9, 3, 64, 64, 600, 0, 577),
            (37, 9, 3, 64, 64, 600, 0, 211),
            (1, 4, 1, 256, 256, 520, 0, 519),
            (37, 4, 1, 256, 256, 300, 16, 100),
            (1, 4, 1, 256, 256, 600, 5, 590),
            (37, 9, 3, 64, 64, 200, 130, 150), // last queries past the cache end
            (3, 2, 2, 40, 24, 10, 0, 0),
            (1, 8, 2, 128, 96, 2000, 0, 1999),
        ];
        for (n_tok, n_head, n_kv, hd, hv, rows, window, start) in cases {
            let s = AttentionShape {
                n_head,
                n_head_kv: n_kv,
                head_dim: hd,
                head_dim_v: hv,
                n_kv_rows: rows,
                window,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            let mut gen =
                |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect() };
            let q = gen(n_tok * n_head * hd);
            let kc = gen(rows * n_kv * hd);
            let vc = gen(rows * n_kv * hv);
            let (qb, kb, vb) = (
                with(&ctx, "q", &q),
                with(&ctx, "k", &kc),
                with(&ctx, "v", &vc),
            );
            let ob = poisoned(&ctx, "out", n_tok * n_head * hv);
            let pb = with(&ctx, "pos", &[3u32, 1, start as u32]);
            let args = AttentionArgs {
                q: &qb.whole(),
                k: &kb.whole(),
                v: &vb.whole(),
                out: &ob.whole(),
                n_tokens: n_tok as u32,
                n_head: n_head as u32,
                n_head_kv: n_kv as u32,
                head_dim: hd as u32,
                head_dim_v: hv as u32,
                n_kv_rows: rows as u32,
                window: window as u32,
                scale: s.scale,
                pos: &pb.whole(),
                pos_offset: 2,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(&mut chain, &args).unwrap();
            chain.run().unwrap();
            let mut want = vec![0f32; n_tok * n_head * hv];
            attention_ref(&s, &q, &kc, &vc, start, &mut want);
            if let Err(e) = check_close(&read(&ctx, &ob, want.len()), &want, REL) {
                panic!("attention {n_tok} tokens {n_head}/{n_kv} heads {hd}/{hv} rows {rows} window {window} at {start}, seed {seed}: {e}");
            }
        }
    }

    #[test]
    fn bad_head_counts_and_short_caches_are_shape_errors() {
        let Some(ctx) = gpu_or_skip("attention_shape_errors") else {
            return;
        };
        let b = poisoned(&ctx, "b", 4096);
        let kc = poisoned(&ctx, "k_cache_l0", 64);
        let pb = with(&ctx, "pos", &[0u32]);
        let k = Attention::new(&ctx).unwrap();
        let mut chain = Chain::new(&ctx).unwrap();
        let mut args = AttentionArgs {
            q: &b.whole(),
            k: &b.whole(),
            v: &b.whole(),
            out: &b.whole(),
            n_tokens: 1,
            n_head: 9,
            n_head_kv: 2,
            head_dim: 64,
            head_dim_v: 64,
            n_kv_rows: 4,
            window: 0,
            scale: 0.125,
            pos: &pb.whole(),
            pos_offset: 0,
        };
        let err = k.record(&mut chain, &args).unwrap_err().to_string();
        assert!(err.contains("n_head 9"), "{err}");
        args.n_head_kv = 3;
        let ks = kc.whole();
        args.k = &ks;
        let err = k.record(&mut chain, &args).unwrap_err().to_string();
        assert!(err.contains("k_cache_l0"), "{err}");
        let bs = b.whole();
        args.k = &bs;
        args.head_dim = 512;
        let err = k.record(&mut chain, &args).unwrap_err().to_string();
        assert!(err.contains("head_dim 512"), "{err}");
    }
}
