//! Input gradient through a frozen GGUF-encoded weight (shader `linear_t.comp`):
//! `dx[t, i] (=|+=) Σ_o dy[t, dy_col + o] · W[o, i]`, i.e. `dX = dY · W` — the backward of
//! [`crate::Linear`] with respect to its input. Weights are read in their GGUF encoding exactly
//! as the forward kernels read them (see [`crate::linear`]); types: those of
//! [`crate::Linear::weight_types`].
//!
//! The kernel is tiled: a workgroup owns 64 in-columns × 64 tokens of `dx` and walks the
//! out-rows 32 at a time, dequantizing the weight tile into shared memory once per step.
//! Every output is summed by one invocation in a fixed order (no atomics: deterministic).

use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::{KernelError, Result};
use crate::linear::QWeightRef;
use crate::qweight::{check_words, row_bytes, type_index, word_slice, QOp, TYPES};

const OP: &str = "linear_t";
/// In-columns and tokens per workgroup tile (`TI`, `TT` in `linear_t.comp`).
const TILE_COLS: u32 = 64;
const TILE_TOKENS: u32 = 64;
/// Push-constant bytes (7 u32).
const PUSH_BYTES: u32 = 28;

/// `dx[t, i] (=|+=) Σ_o dy[t, dy_col + o] · W[o, i]` for `t < n_tokens`, `i < w.n_cols`,
/// `o < w.n_rows`.
pub struct LinearTArgs<'a> {
    /// The frozen weight [n_rows = out features, n_cols = in features] in its GGUF encoding (see linear::QWeightRef).
    pub w: QWeightRef<'a>,
    /// [n_tokens, dy_stride] f32; this weight's output rows are dy's columns dy_col .. dy_col + w.n_rows.
    pub dy: &'a BufferSlice,
    /// Floats between consecutive tokens' rows of `dy`; `>= dy_col + w.n_rows`.
    pub dy_stride: u32,
    /// The column of `dy` holding this weight's output row 0.
    pub dy_col: u32,
    /// [n_tokens, w.n_cols] f32. Must not alias `dy` or the weights.
    pub dx: &'a BufferSlice,
    /// Tokens (rows of `dy` and `dx`).
    pub n_tokens: u32,
    /// dx += product instead of dx = product (dx is not read when false).
    pub accumulate: bool,
}

/// The input-gradient kernel, one pipeline per weight type, built once.
pub struct LinearT {
    pipelines: Vec<Pipeline>,
}

impl LinearT {
    /// Builds every type's pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        let pipelines = (0..TYPES.len())
            .map(|ti| {
                Pipeline::new(
                    ctx,
                    &PipelineDesc::new(QOp::LinearT.variant(ti), 3, PUSH_BYTES),
                )
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(LinearT { pipelines })
    }

    /// Whether the kernel reads weights of type `ty`.
    pub fn supports(ty: GgmlType) -> bool {
        TYPES.contains(&ty)
    }

    /// Records `dx (=|+=) dy[:, dy_col .. dy_col + n_rows] · W`. Checks the type (`n_cols` a
    /// multiple of the block size: 32 for the legacy quants, MXFP4 and IQ4_NL, 256 for the
    /// K-quants and IQ4_XS, any for floats), the shapes and every operand's size.
    pub fn record(&self, chain: &mut Chain, a: &LinearTArgs) -> Result<()> {
        let shape = |detail: String| KernelError::Shape { op: OP, detail };
        let w = &a.w;
        let ti = type_index(OP, w.ty)?;
        let rb = row_bytes(OP, w.ty, w.n_cols)?;
        if w.n_rows == 0 || a.n_tokens == 0 {
            return Err(shape(format!(
                "empty product: n_rows = {}, n_tokens = {}",
                w.n_rows, a.n_tokens
            )));
        }
        let data = word_slice(OP, "weights", w.data, u64::from(w.n_rows) * u64::from(rb))?;
        let row_end = u64::from(a.dy_col) + u64::from(w.n_rows);
        if u64::from(a.dy_stride) < row_end {
            return Err(shape(format!(
                "dy_stride {} < dy_col {} + n_rows {}",
                a.dy_stride, a.dy_col, w.n_rows
            )));
        }
        let dy_floats = u64::from(a.n_tokens - 1) * u64::from(a.dy_stride) + row_end;
        check_words(OP, "dy", a.dy, dy_floats, "floats")?;
        let dx_floats = u64::from(a.n_tokens) * u64::from(w.n_cols);
        check_words(OP, "dx", a.dx, dx_floats, "floats")?;
        let groups = [
            w.n_cols.div_ceil(TILE_COLS),
            a.n_tokens.div_ceil(TILE_TOKENS),
            1,
        ];
        let max = chain.context().caps().max_workgroup_count;
        if groups[0] > max[0] || groups[1] > max[1] {
            return Err(shape(format!(
                "{} columns x {} tokens need {}x{} workgroups, over {}x{}",
                w.n_cols, a.n_tokens, groups[0], groups[1], max[0], max[1]
            )));
        }
        let push = Push::new()
            .u32(w.n_rows)
            .u32(w.n_cols)
            .u32(a.n_tokens)
            .u32(a.dy_stride)
            .u32(a.dy_col)
            .u32(rb)
            .u32(u32::from(a.accumulate));
        chain.dispatch(
            &self.pipelines[ti],
            &[data, a.dy.clone(), a.dx.clone()],
            &push,
            groups,
        )?;
        Ok(())
    }
}

/// dx[t, i] (+)= Σ_o dy[t, dy_col + o] * W[o, i], W dequantized by octoflow_gguf::quant (f64 accumulation).
///
/// `w`: `n_rows` rows of `quantized_size(ty, n_cols)` bytes; `dy`: at least
/// `(n_tokens - 1) * dy_stride + dy_col + n_rows` floats; `dx`: `[n_tokens, n_cols]`. With
/// `accumulate` the sum starts from `dx`'s value.
///
/// # Panics
/// When `w` is not `n_rows` valid rows of `ty` (the reference is a test oracle).
#[allow(clippy::too_many_arguments)]
pub fn linear_t_ref(
    ty: GgmlType,
    w: &[u8],
    n_rows: usize,
    n_cols: usize,
    dy: &[f32],
    dy_stride: usize,
    dy_col: usize,
    dx: &mut [f32],
    n_tokens: usize,
    accumulate: bool,
) {
    let rb = octoflow_gguf::quant::quantized_size(ty, n_cols)
        .unwrap_or_else(|e| panic!("linear_t_ref: {e}"));
    let mut acc: Vec<f64> = if accumulate {
        dx[..n_tokens * n_cols]
            .iter()
            .map(|&v| f64::from(v))
            .collect()
    } else {
        vec![0.0; n_tokens * n_cols]
    };
    let mut row = vec![0f32; n_cols];
    for o in 0..n_rows {
        octoflow_gguf::quant::dequantize(ty, &w[o * rb..(o + 1) * rb], &mut row)
            .unwrap_or_else(|e| panic!("linear_t_ref: row {o}: {e}"));
        for t in 0..n_tokens {
            let g = f64::from(dy[t * dy_stride + dy_col + o]);
            for (a, &wv) in acc[t * n_cols..(t + 1) * n_cols].iter_mut().zip(&row) {
                *a += g * f64::from(wv);
            }
        }
    }
    for (d, a) in dx.iter_mut().zip(acc) {
        *d = a as f32;
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use octoflow_vk::{Buffer, MemoryKind};
    use rand::rngs::StdRng;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{buffer_with, random_cols, random_weights};

    /// Weights decode exactly as the CPU codec (quant.glsl's contract) and each output sums up
    /// to ~600 f32 products of O(1) terms in a fixed order, against the f64 reference: typical
    /// errors are ~sqrt(n)·2⁻²⁴ ≈ 1e-6 of the output scale (check_close's floor is 1% of the
    /// largest output). 1e-4 leaves margin, while one misdecoded weight, a skipped row or a
    /// misplaced dy column moves an output by >= 1e-2 of that scale.
    /// Measured on lavapipe: up to 3.4e-5.
    const REL: f32 = 1e-4;
    /// Sums of ~8000 terms (the many-rows case) in f32: the rounding error grows with the
    /// length of the sum while the 1% floor of check_close stays put. Measured up to 7.3e-5.
    const REL_LONG: f32 = 3e-4;

    /// One random case of `ty`: `n_rows` out-rows, `n_cols` in-columns, `n_tokens` tokens.
    #[allow(clippy::too_many_arguments)]
    fn check_case(
        ctx: &Context,
        k: &LinearT,
        rng: &mut StdRng,
        seed: u64,
        ty: GgmlType,
        n_rows: usize,
        n_cols: usize,
        n_tokens: usize,
        dy_col: usize,
        accumulate: bool,
        rel: f32,
    ) {
        let dy_stride = dy_col + n_rows + rng.gen_range(0..3);
        let wq = random_weights(rng, ty, n_rows, n_cols);
        let wb = buffer_with(ctx, "w", &wq);
        let dy: Vec<f32> = (0..n_tokens * dy_stride)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let dyb = buffer_with(ctx, "dy", octoflow_vk::as_bytes(&dy));
        let dx0: Vec<f32> = if accumulate {
            (0..n_tokens * n_cols)
                .map(|_| rng.gen_range(-4.0..4.0))
                .collect()
        } else {
            vec![0.0; n_tokens * n_cols]
        };
        let dxb = buffer_with(ctx, "dx", octoflow_vk::as_bytes(&dx0));
        if !accumulate {
            // poisoned: the kernel must write every element without reading it
            ctx.fill(&dxb, 0, dxb.size(), f32::NAN.to_bits()).unwrap();
        }
        let args = LinearTArgs {
            w: QWeightRef {
                ty,
                data: &wb.whole(),
                n_rows: n_rows as u32,
                n_cols: n_cols as u32,
            },
            dy: &dyb.whole(),
            dy_stride: dy_stride as u32,
            dy_col: dy_col as u32,
            dx: &dxb.whole(),
            n_tokens: n_tokens as u32,
            accumulate,
        };
        let mut chain = Chain::new(ctx).unwrap();
        k.record(&mut chain, &args).unwrap();
        chain.run().unwrap();
        let mut got = vec![0f32; n_tokens * n_cols];
        ctx.download(&dxb, 0, &mut got).unwrap();
        let mut want = dx0.clone();
        linear_t_ref(
            ty, &wq, n_rows, n_cols, &dy, dy_stride, dy_col, &mut want, n_tokens, accumulate,
        );
        if let Err(e) = check_close(&got, &want, rel) {
            panic!(
                "linear_t {ty} {n_rows}x{n_cols}, {n_tokens} tokens, dy_col {dy_col}, \
                 dy_stride {dy_stride}, accumulate {accumulate}, seed {seed}: {e}"
            );
        }
    }

    /// Several shapes of `ty`: odd row and token counts (partial tiles), one-row and one-token
    /// products, more rows than one step, a dy column offset, accumulate on and off.
    fn check_type(ty: GgmlType) {
        let Some(ctx) = gpu_or_skip(&format!("linear_t_{ty}")) else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = LinearT::new(&ctx).unwrap();
        let bs = ty.block_size();
        let cases = [
            (1, random_cols(&mut rng, ty), 1, 0, false),
            (
                rng.gen_range(33..200),
                random_cols(&mut rng, ty),
                70,
                3,
                true,
            ),
            (rng.gen_range(1..40), random_cols(&mut rng, ty), 5, 0, false),
            (97, bs.max(32) * 3, 129, 7, false),
            (
                rng.gen_range(1..300),
                random_cols(&mut rng, ty),
                64,
                0,
                true,
            ),
        ];
        for (n_rows, n_cols, n_tokens, dy_col, accumulate) in cases {
            check_case(
                &ctx, &k, &mut rng, seed, ty, n_rows, n_cols, n_tokens, dy_col, accumulate, REL,
            );
        }
        assert_no_validation_errors(&ctx);
    }

    macro_rules! type_tests {
        ($($name:ident => $ty:ident),*) => {$(
            #[test]
            fn $name() {
                check_type(GgmlType::$ty);
            }
        )*};
    }

    type_tests!(
        gpu_linear_t_f32 => F32, gpu_linear_t_f16 => F16, gpu_linear_t_q4_0 => Q4_0,
        gpu_linear_t_q4_1 => Q4_1, gpu_linear_t_q5_0 => Q5_0, gpu_linear_t_q5_1 => Q5_1,
        gpu_linear_t_q8_0 => Q8_0, gpu_linear_t_q4_k => Q4_K, gpu_linear_t_q5_k => Q5_K,
        gpu_linear_t_q6_k => Q6_K, gpu_linear_t_bf16 => BF16, gpu_linear_t_mxfp4 => MXFP4,
        gpu_linear_t_iq4_nl => IQ4_NL, gpu_linear_t_q2_k => Q2_K, gpu_linear_t_q3_k => Q3_K,
        gpu_linear_t_iq4_xs => IQ4_XS
    );

    /// A vocabulary-like product: many out-rows (several thousand steps of the row loop) into
    /// a few tokens, as for the output projection's gradient.
    #[test]
    fn gpu_linear_t_many_rows() {
        let Some(ctx) = gpu_or_skip("linear_t_many_rows") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = LinearT::new(&ctx).unwrap();
        let n_rows = rng.gen_range(6000..9000);
        check_case(
            &ctx,
            &k,
            &mut rng,
            seed,
            GgmlType::Q8_0,
            n_rows,
            128,
            3,
            0,
            false,
            REL_LONG,
        );
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn bad_shapes_and_types_are_clear_errors() {
        let Some(ctx) = gpu_or_skip("linear_t_bad_shapes") else {
            return;
        };
        let k = LinearT::new(&ctx).unwrap();
        let big = Buffer::new(&ctx, "big", 1 << 20, MemoryKind::DeviceLocal).unwrap();
        let small = Buffer::new(&ctx, "small", 64, MemoryKind::DeviceLocal).unwrap();
        let (bw, sw) = (big.whole(), small.whole());
        let err = |ty, n_cols, dy: &BufferSlice, dx: &BufferSlice, dy_stride| {
            let a = LinearTArgs {
                w: QWeightRef {
                    ty,
                    data: &bw,
                    n_rows: 8,
                    n_cols,
                },
                dy,
                dy_stride,
                dy_col: 2,
                dx,
                n_tokens: 3,
                accumulate: false,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(&mut chain, &a).unwrap_err().to_string()
        };
        let e = err(GgmlType::Q4_K, 300, &bw, &bw, 10);
        assert!(e.contains("300") && e.contains("256"), "{e}");
        let e = err(GgmlType::Q8_K, 256, &bw, &bw, 10);
        assert!(e.contains("Q8_K") && e.contains("not supported"), "{e}");
        let e = err(GgmlType::Q8_0, 64, &sw, &bw, 10);
        assert!(e.contains("dy (small)") && e.contains("30 floats"), "{e}");
        let e = err(GgmlType::Q8_0, 64, &bw, &sw, 10);
        assert!(e.contains("dx (small)") && e.contains("192 floats"), "{e}");
        let e = err(GgmlType::F32, 4, &bw, &bw, 9);
        assert!(e.contains("dy_stride 9 < dy_col 2 + n_rows 8"), "{e}");
        assert!(!LinearT::supports(GgmlType::Q8_K) && LinearT::supports(GgmlType::Q6_K));
    }
}
