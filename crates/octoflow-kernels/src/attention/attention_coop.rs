//! Prefill attention on cooperative matrices (`attention_coop.comp`, VK_KHR_cooperative_matrix
//! with f16 operands and f32 accumulators): the run-mode path of [`crate::attention::Attention`]
//! for heads of 64 or 128 dims on devices that have them. Same operands and meaning as
//! `attention.comp`; q, k, v and the softmax weights are rounded to f16 before their products
//! ([`attention_coop_ref`] is the reference that rounds the same values).

use octoflow_vk::{Chain, Context, Pipeline, Push};

use crate::attention::{
    attention_ref_rounded, merge_parts, split_parts, validate, AttentionArgs, AttentionShape,
};
use crate::error::Result;
use crate::kv_type::{KvType, PerKv};
use crate::matmul_coop::{coop_pipeline, MatmulCoop};
use crate::operand::Positions;
use crate::scratch::QueueScratch;
use crate::shaders;
use crate::tuning::Tuning;

/// Tokens per workgroup (`BR` in the shader).
const TOKENS_PER_GROUP: u32 = 64;
/// Most key pieces.
const MAX_SPLIT: u32 = 16;
/// Keys per block of the d64 / d128 variants (`BC`).
const BLOCK: [u32; 2] = [64, 32];

/// The pipelines, one per head width.
pub(crate) struct AttentionCoop {
    /// The d64 and d128 pipelines per cache type (f16 ones where the device has 16-bit
    /// storage buffers).
    pipelines: PerKv<Option<(Pipeline, Pipeline)>>,
    /// Key splits aim at this many workgroups ([`Tuning::attention_target_groups`]).
    target_groups: u32,
}

impl AttentionCoop {
    /// The pipelines where the device has what `matmul_coop.comp` needs (16 x 16 x 16 f16 → f32
    /// cooperative matrices, 32-wide full subgroups), else `None`.
    pub(crate) fn new(ctx: &Context) -> Result<Option<Self>> {
        let caps = ctx.caps();
        if !MatmulCoop::supported(caps) {
            return Ok(None);
        }
        Ok(Some(AttentionCoop {
            pipelines: PerKv {
                f32: Some((
                    coop_pipeline(ctx, shaders::ATTENTION_COOP_D64, 7, 36)?,
                    coop_pipeline(ctx, shaders::ATTENTION_COOP_D128, 7, 36)?,
                )),
                f16: if KvType::F16.supported(caps) {
                    Some((
                        coop_pipeline(ctx, shaders::ATTENTION_COOP_D64_KV16, 7, 36)?,
                        coop_pipeline(ctx, shaders::ATTENTION_COOP_D128_KV16, 7, 36)?,
                    ))
                } else {
                    None
                },
                q8: Some((
                    coop_pipeline(ctx, shaders::ATTENTION_COOP_D64_KVQ8, 7, 36)?,
                    coop_pipeline(ctx, shaders::ATTENTION_COOP_D128_KVQ8, 7, 36)?,
                )),
            },
            target_groups: Tuning::from_caps(caps).attention_target_groups,
        }))
    }

    /// Whether this kernel computes `a`: a run of positions, keys and values of the same width
    /// (64 or 128), and q/k/v bindings it can read as vec4s.
    pub(crate) fn applies(a: &AttentionArgs) -> bool {
        let aligned = |s: &octoflow_vk::BufferSlice| s.offset.is_multiple_of(16);
        a.positions == Positions::Run
            && a.head_dim == a.head_dim_v
            && matches!(a.head_dim, 64 | 128)
            && aligned(a.q)
            && aligned(a.k)
            && aligned(a.v)
    }

    /// Records the attention of `a` (which [`Self::applies`]); with `split` pieces of the key
    /// range (0: the device's choice) partial results go to `scratch` and `merge`
    /// (`attention_merge.comp`) combines them after a barrier.
    pub(crate) fn record(
        &self,
        chain: &mut Chain,
        a: &AttentionArgs,
        split: u32,
        scratch: &QueueScratch,
        merge: &Pipeline,
    ) -> Result<()> {
        validate(a)?;
        let caps = chain.context().caps();
        let Some((d64, d128)) = self.pipelines.get("attention", caps, a.kv)? else {
            return Err(crate::operand::bad(
                "attention",
                format!("no {} KV cache pipelines were built", a.kv),
            ));
        };
        let (pipeline, block) = if a.head_dim == 64 {
            (d64, BLOCK[0])
        } else {
            (d128, BLOCK[1])
        };
        let tiles = a.n_tokens.div_ceil(TOKENS_PER_GROUP) * a.n_head;
        let split = if split == 0 {
            self.target_groups.div_ceil(tiles)
        } else {
            split
        };
        let split = split.clamp(1, MAX_SPLIT.min(a.n_kv_rows.div_ceil(block)));
        let part = split_parts(chain, scratch, a, split)?;
        let push = Push::new()
            .u32(a.n_tokens)
            .u32(a.n_head)
            .u32(a.n_head_kv)
            .u32(a.n_kv_rows)
            .u32(a.window)
            .u32(a.pos_offset)
            .f32(a.scale)
            .u32(split)
            .u32(a.has_sinks());
        let groups = [a.n_tokens.div_ceil(TOKENS_PER_GROUP), a.n_head, split];
        let max = chain.context().caps().max_workgroup_count;
        if groups[0] > max[0] || groups[1] > max[1] {
            return Err(crate::operand::bad(
                "attention",
                format!(
                    "{} tokens x {} heads need too many workgroups",
                    a.n_tokens, a.n_head
                ),
            ));
        }
        chain.dispatch(pipeline, &a.bindings(&part), &push, groups)?;
        merge_parts(chain, merge, a, part, split)
    }
}

/// CPU reference of the kernel: [`crate::attention::attention_ref`]'s scores from q and k
/// rounded to f16 (summed in f64), the maximum m and sum l = Σ exp(s - m) in f64, and the
/// output Σ f16(exp(s - m)) · f16(v) / l. With `mag`, also each output's magnitude
/// Σ w · |v| / l: the scale its rounding errors are relative to.
pub fn attention_coop_ref(
    s: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    start: usize,
    out: &mut [f32],
    mag: Option<&mut [f32]>,
) {
    let h16 = |x: f32| f64::from(half::f16::from_f32(x).to_f32());
    attention_ref_rounded(s, q, k, v, start, out, mag, h16, |w| h16(w as f32));
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use rand::Rng;

    use super::*;
    use crate::attention::Attention;
    use crate::testkit::{poisoned, read, with};

    /// Errors are judged against each output's magnitude Σ w·|v| / l (an average of many
    /// random values cancels far below it). The reference rounds the same operands (q, k, v,
    /// the weights) to f16; what is left is the tensor cores' f32 accumulation (it truncates)
    /// and weights whose f16 rounding goes the other way — the GPU's exp differs from f64's in
    /// the last bits, and split pieces round against their own maximum, not the row's: such a
    /// weight lands on the neighbouring f16 value, one ulp away, which is up to 2⁻¹⁰ of the
    /// weight (just above a power of two). With few keys one weight carries most of an output,
    /// so one flip moves it by up to ~1e-3 of the magnitude, and the accumulation adds a little
    /// (the H100 showed 1.14e-3 in 2 of 25 runs of fresh inputs). A key dropped or counted
    /// twice moves an output by its weight, ~1/n of the magnitude (3.7e-2 at the 27 keys of
    /// those runs, 3e-3 at 330); a wrong head or block by far more.
    const REL_COOP: f32 = 1.5e-3;

    /// |got - want| ≤ rel · mag + 1e-6 everywhere (NaN fails), else the first offender.
    fn check_mag(got: &[f32], want: &[f32], mag: &[f32], rel: f32) -> Result<(), String> {
        for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
            let bound = rel * m + 1e-6;
            let err = (g - w).abs();
            if err.is_nan() || err > bound {
                return Err(format!(
                    "element {i}: {g} vs reference {w} (magnitude {m}, error {:.3e} > {bound:.3e})",
                    err
                ));
            }
        }
        Ok(())
    }

    #[test]
    fn gpu_attention_coop_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("attention_coop") else {
            return;
        };
        let Some(kernel) = AttentionCoop::new(&ctx).unwrap() else {
            println!(
                "attention_coop: skipped, no cooperative matrices on {}",
                ctx.caps().name
            );
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        // cases 12..15: keys that grow along the cache, so the scores' running maximum keeps
        // rising block after block (the kernel's rescale of its accumulators)
        for case in 0..15 {
            let growing = case >= 12;
            let hd = if case % 2 == 0 { 64 } else { 128 };
            let n_kv = [1usize, 2, 4][case % 3];
            let n_head = n_kv * [1usize, 3, 7][(case / 3) % 3];
            let n_tok = if case < 2 {
                512
            } else {
                rng.gen_range(1..200usize)
            };
            let start = if case % 4 == 3 {
                rng.gen_range(1..300usize)
            } else {
                0
            };
            // sometimes a cache shorter than the run (keys past it are never read)
            let rows = if case % 5 == 4 {
                (start + n_tok).saturating_sub(rng.gen_range(0..10)).max(1)
            } else {
                start + n_tok + rng.gen_range(0..20)
            };
            let window = if case % 3 == 2 {
                rng.gen_range(1..100usize)
            } else {
                0
            };
            // sink logits in the scores' range, in half the cases (each split among them)
            let sinks = case % 4 >= 2;
            let sink_logits: Vec<f32> = (0..n_head).map(|_| rng.gen_range(-2.0..4.0)).collect();
            let s = AttentionShape {
                n_head,
                n_head_kv: n_kv,
                head_dim: hd,
                head_dim_v: hd,
                n_kv_rows: rows,
                window,
                scale: 1.0 / (hd as f32).sqrt(),
                sinks: sinks.then_some(sink_logits.as_slice()),
            };
            let mut gen =
                |n: usize| -> Vec<f32> { (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect() };
            let q = gen(n_tok * n_head * hd);
            // f32, f16 and q8_0 caches in turn, each with both head widths (their values are
            // what the reference rounds to)
            let kv = match (case / 2) % 3 {
                0 => KvType::F32,
                1 => KvType::F16,
                _ => KvType::Q8_0,
            };
            let mut kraw = gen(rows * n_kv * hd);
            if growing {
                for (i, x) in kraw.iter_mut().enumerate() {
                    *x *= 1.0 + (i / (n_kv * hd)) as f32 / 16.0;
                }
            }
            let kc = kv.decode(&kv.encode(&kraw));
            let vc = kv.decode(&kv.encode(&gen(rows * n_kv * hd)));
            let (qb, kb, vb) = (
                with(&ctx, "q", &q),
                with(&ctx, "k", &kv.encode(&kc)),
                with(&ctx, "v", &kv.encode(&vc)),
            );
            let ob = poisoned(&ctx, "out", n_tok * n_head * hd);
            let pb = with(&ctx, "pos", &[3u32, 1, start as u32]);
            let sb = with(&ctx, "sinks", &sink_logits);
            let sw = sb.whole();
            let args = AttentionArgs {
                kv,
                q: &qb.whole(),
                k: &kb.whole(),
                v: &vb.whole(),
                out: &ob.whole(),
                n_tokens: n_tok as u32,
                n_head: n_head as u32,
                n_head_kv: n_kv as u32,
                head_dim: hd as u32,
                head_dim_v: hd as u32,
                n_kv_rows: rows as u32,
                window: window as u32,
                scale: s.scale,
                pos: &pb.whole(),
                pos_offset: 2,
                positions: Positions::Run,
                sinks: sinks.then_some(&sw),
            };
            assert!(AttentionCoop::applies(&args));
            // the kernel itself, then through Attention::record (which picks it for runs of
            // more than a decode step's tokens)
            // (split 1, 3 or the device's choice).
            let attention = Attention::new(&ctx).unwrap();
            let mut chain = Chain::new(&ctx).unwrap();
            let mut split = [1u32, 3, 0][case % 3];
            if case % 2 == 0 {
                let (scratch, merge) = attention.split_parts();
                kernel
                    .record(&mut chain, &args, split, scratch, merge)
                    .unwrap();
            } else {
                attention.record(&mut chain, &args).unwrap();
                split = 0;
            }
            chain.run().unwrap();
            let mut want = vec![0f32; n_tok * n_head * hd];
            let mut mag = vec![0f32; want.len()];
            attention_coop_ref(&s, &q, &kc, &vc, start, &mut want, Some(&mut mag));
            if let Err(e) = check_mag(&read(&ctx, &ob, want.len()), &want, &mag, REL_COOP) {
                panic!(
                    "attention_coop {n_tok} tokens {n_head}/{n_kv} heads d {hd} rows {rows} \
                     window {window} at {start}, split {split}, sinks {sinks}, {kv} caches, \
                     growing keys {growing} (seed {seed}): {e}"
                );
            }
        }
        assert_no_validation_errors(&ctx);
    }
}
