//! The frozen projections and their LoRA adapters on the CPU: `y = W x (+ bias) + scale · B A
//! dropout(x)`, the input gradient through both, and the adapters' gradients.

use super::gemm::{gemm, Out, View};
use super::ops;
use super::weights::Dense;
use super::CpuTrainer;
use crate::gpu::TARGET_SLOTS;
use crate::lora::{LoraEntry, Target};

/// `y = x Wᵀ (+ bias)`: x `[T, cols]`, y `[T, rows]`.
pub(crate) fn linear(w: &Dense, x: &[f32], y: &mut [f32], bias: Option<&[f32]>) {
    let t = x.len() / w.cols;
    let out = Out {
        data: y,
        ld: w.rows,
    };
    gemm(
        [t, w.rows, w.cols],
        1.0,
        View::rows(x, w.cols),
        View::t(&w.w, w.cols),
        0.0,
        out,
    );
    if let Some(b) = bias {
        for r in y.chunks_exact_mut(w.rows) {
            r.iter_mut().zip(b).for_each(|(v, b)| *v += b);
        }
    }
}

/// `dx (+)= dy W`: dy `[T, rows]`, dx `[T, cols]`.
pub(crate) fn linear_t(w: &Dense, dy: &[f32], dx: &mut [f32], accumulate: bool) {
    let t = dy.len() / w.rows;
    let beta = if accumulate { 1.0 } else { 0.0 };
    let out = Out {
        data: dx,
        ld: w.cols,
    };
    gemm(
        [t, w.cols, w.rows],
        1.0,
        View::rows(dy, w.rows),
        View::rows(&w.w, w.cols),
        beta,
        out,
    );
}

/// The salt of an adapter's dropout mask (the GPU step's).
fn salt(e: &LoraEntry) -> u32 {
    (e.layer * TARGET_SLOTS + e.target as usize) as u32
}

impl CpuTrainer {
    /// The adapter's input: `x`, or while training (`seed`) `dropout(x)` (the same mask in
    /// the forward and backward).
    fn lora_input<'a>(
        &self,
        e: &LoraEntry,
        x: &'a [f32],
        seed: Option<u32>,
    ) -> std::borrow::Cow<'a, [f32]> {
        let Some(seed) = seed.filter(|_| self.dropout != 0.0) else {
            return x.into();
        };
        let mut out = vec![0f32; x.len()];
        ops::dropout(x, &mut out, self.dropout, seed, salt(e));
        out.into()
    }

    /// `y += scale · (x_in Aᵀ) Bᵀ` for the adapter on `target` of `layer`, if the run has one;
    /// returns `h = x_in Aᵀ` `[T, rank]` (the backward reads it; empty without an adapter).
    pub(crate) fn lora_forward(
        &self,
        layer: usize,
        target: Target,
        x: &[f32],
        y: &mut [f32],
        seed: Option<u32>,
    ) -> Vec<f32> {
        let Some(e) = self.layout.get(layer, target).copied() else {
            return Vec::new();
        };
        let (r, t) = (self.layout.rank, x.len() / e.n_in);
        let xin = self.lora_input(&e, x, seed);
        let a = &self.params[e.a..e.a + r * e.n_in];
        let b = &self.params[e.b..e.b + e.n_out * r];
        let mut h = vec![0f32; t * r];
        let hv = Out {
            data: &mut h,
            ld: r,
        };
        gemm(
            [t, r, e.n_in],
            1.0,
            View::rows(&xin, e.n_in),
            View::t(a, e.n_in),
            0.0,
            hv,
        );
        let yv = Out {
            data: y,
            ld: e.n_out,
        };
        let s = self.layout.scale;
        gemm(
            [t, e.n_out, r],
            s,
            View::rows(&h, r),
            View::t(b, r),
            1.0,
            yv,
        );
        h
    }

    /// The adapter's backward given `dy = ∂L/∂y` `[T, n_out]`: ∂L/∂A and ∂L/∂B accumulate into
    /// the gradients and its share of ∂L/∂x is added to `dx` `[T, n_in]`. `x` is the
    /// projection's input and `h` what [`CpuTrainer::lora_forward`] returned.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lora_backward(
        &mut self,
        layer: usize,
        target: Target,
        x: &[f32],
        h: &[f32],
        dy: &[f32],
        dx: &mut [f32],
        seed: u32,
    ) {
        let Some(e) = self.layout.get(layer, target).copied() else {
            return;
        };
        let (r, s, t) = (self.layout.rank, self.layout.scale, x.len() / e.n_in);
        // dB += s · dyᵀ h
        let gb = Out {
            data: &mut self.grads[e.b..e.b + e.n_out * r],
            ld: r,
        };
        gemm(
            [e.n_out, r, t],
            s,
            View::t(dy, e.n_out),
            View::rows(h, r),
            1.0,
            gb,
        );
        // dh = s · dy B
        let mut dh = vec![0f32; t * r];
        let b = &self.params[e.b..e.b + e.n_out * r];
        let dhv = Out {
            data: &mut dh,
            ld: r,
        };
        gemm(
            [t, r, e.n_out],
            s,
            View::rows(dy, e.n_out),
            View::rows(b, r),
            0.0,
            dhv,
        );
        // dA += dhᵀ x_in
        let xin = self.lora_input(&e, x, Some(seed));
        let ga = Out {
            data: &mut self.grads[e.a..e.a + r * e.n_in],
            ld: e.n_in,
        };
        gemm(
            [r, e.n_in, t],
            1.0,
            View::t(&dh, r),
            View::rows(&xin, e.n_in),
            1.0,
            ga,
        );
        drop(xin);
        // dx += mask(dh A)
        let a = &self.params[e.a..e.a + r * e.n_in];
        if self.dropout == 0.0 {
            let o = Out {
                data: dx,
                ld: e.n_in,
            };
            gemm(
                [t, e.n_in, r],
                1.0,
                View::rows(&dh, r),
                View::rows(a, e.n_in),
                1.0,
                o,
            );
        } else {
            let mut tmp = vec![0f32; t * e.n_in];
            let o = Out {
                data: &mut tmp,
                ld: e.n_in,
            };
            gemm(
                [t, e.n_in, r],
                1.0,
                View::rows(&dh, r),
                View::rows(a, e.n_in),
                0.0,
                o,
            );
            let mut masked = vec![0f32; tmp.len()];
            ops::dropout(&tmp, &mut masked, self.dropout, seed, salt(&e));
            dx.iter_mut().zip(&masked).for_each(|(d, m)| *d += m);
        }
    }
}
