//! The sum of split-K pieces (shader `split_sum.comp`): the second pass of a matrix product
//! split along its columns ([`crate::MatmulCoop`]).

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

/// Invocations per workgroup (`local_size_x` in `split_sum.comp`).
const LOCAL_SIZE: u32 = 256;

/// Where the pieces' sum goes: `y[t * y_stride + y_col + r]`, with the linear layer's options.
#[derive(Debug, Clone, Copy)]
pub struct SumTarget {
    /// Outputs per token.
    pub n_rows: u32,
    /// Tokens.
    pub n_tokens: u32,
    /// Floats between consecutive tokens' outputs; `>= y_col + n_rows`.
    pub y_stride: u32,
    /// First output column.
    pub y_col: u32,
    /// Add `bias[r]`.
    pub bias: bool,
    /// Add into y instead of overwriting.
    pub accumulate: bool,
}

/// The split-K sum kernel, built once per device.
pub struct SplitSum {
    pipeline: Pipeline,
}

impl SplitSum {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(SplitSum {
            pipeline: Pipeline::new(
                ctx,
                &PipelineDesc::new(shaders::SPLIT_SUM, 3, 24).label("split_sum"),
            )?,
        })
    }

    /// Records `y[t * y_stride + y_col + r] (=|+=) Σ_p part[p][t][r] (+ bias[r])`.
    /// `part`: `[split, n_tokens, n_rows]` f32; `bias`: `[n_rows]` f32 (any slice when unused).
    pub fn record(
        &self,
        chain: &mut Chain,
        part: &BufferSlice,
        split: u32,
        y: &BufferSlice,
        bias: &BufferSlice,
        t: &SumTarget,
    ) -> Result<()> {
        const OP: &str = "split_sum";
        let outputs = u64::from(t.n_rows) * u64::from(t.n_tokens);
        if outputs == 0 || split == 0 || t.y_stride < t.y_col + t.n_rows {
            return Err(bad(OP, format!("bad shape {t:?}, {split} pieces")));
        }
        need(OP, "part", part, u128::from(split) * u128::from(outputs))?;
        let y_len =
            u128::from(t.n_tokens - 1) * u128::from(t.y_stride) + u128::from(t.y_col + t.n_rows);
        need(OP, "y", y, y_len)?;
        if t.bias {
            need(OP, "bias", bias, u128::from(t.n_rows))?;
        }
        let push = Push::new()
            .u32(t.n_rows)
            .u32(t.n_tokens)
            .u32(split)
            .u32(t.y_stride)
            .u32(t.y_col)
            .u32(u32::from(t.bias) | (u32::from(t.accumulate) << 1));
        let groups = chain.context().groups_1d(outputs, LOCAL_SIZE)?;
        chain.dispatch(
            &self.pipeline,
            &[part.clone(), y.clone(), bias.clone()],
            &push,
            groups,
        )?;
        Ok(())
    }
}

/// CPU reference: the pieces added in order, then the bias, then (accumulating) y's old value.
pub fn split_sum_ref(part: &[f32], split: usize, y: &mut [f32], bias: &[f32], t: &SumTarget) {
    let (rows, tokens) = (t.n_rows as usize, t.n_tokens as usize);
    for tok in 0..tokens {
        for r in 0..rows {
            let mut s = 0f32;
            for p in 0..split {
                s += part[(p * tokens + tok) * rows + r];
            }
            if t.bias {
                s += bias[r];
            }
            let o = tok * t.y_stride as usize + t.y_col as usize + r;
            if t.accumulate {
                s += y[o];
            }
            y[o] = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::gpu_or_skip;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{read, with};

    #[test]
    fn gpu_split_sum_matches_the_reference() {
        let Some(ctx) = gpu_or_skip("gpu_split_sum") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = SplitSum::new(&ctx).unwrap();
        for (case, (rows, tokens, split)) in [(1usize, 1usize, 2usize), (300, 7, 5), (65, 33, 16)]
            .into_iter()
            .enumerate()
        {
            let t = SumTarget {
                n_rows: rows as u32,
                n_tokens: tokens as u32,
                y_stride: (rows + 3) as u32,
                y_col: 2,
                bias: case != 1,
                accumulate: case == 1,
            };
            let part: Vec<f32> = (0..split * rows * tokens)
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            let bias: Vec<f32> = (0..rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let y0: Vec<f32> = (0..tokens * (rows + 3))
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            let (pb, bb, yb) = (
                with(&ctx, "part", &part),
                with(&ctx, "bias", &bias),
                with(&ctx, "y", &y0),
            );
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(
                &mut chain,
                &pb.whole(),
                split as u32,
                &yb.whole(),
                &bb.whole(),
                &t,
            )
            .unwrap();
            chain.run().unwrap();
            let mut want = y0.clone();
            split_sum_ref(&part, split, &mut want, &bias, &t);
            // the same additions in the same order: exact
            if let Err(e) = check_close(&read(&ctx, &yb, want.len()), &want, 0.0) {
                panic!("split_sum {t:?} x{split}, seed {seed}: {e}");
            }
        }
    }

    #[test]
    fn short_part_is_a_shape_error() {
        let Some(ctx) = gpu_or_skip("split_sum_shapes") else {
            return;
        };
        let k = SplitSum::new(&ctx).unwrap();
        let b = with(&ctx, "scratch", &[0f32; 8]);
        let t = SumTarget {
            n_rows: 4,
            n_tokens: 1,
            y_stride: 4,
            y_col: 0,
            bias: false,
            accumulate: false,
        };
        let mut chain = Chain::new(&ctx).unwrap();
        let err = k
            .record(&mut chain, &b.whole(), 3, &b.whole(), &b.whole(), &t)
            .unwrap_err()
            .to_string();
        assert!(err.contains("part") && err.contains("scratch"), "{err}");
    }
}
