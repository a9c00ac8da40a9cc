//! The loss head on the CPU: final norm, the vocabulary projection and the cross-entropy, and
//! their gradient back to the last layer's output. Only rows that carry a loss (a label and a
//! nonzero weight) are projected: prompt tokens, padding and ignored turns cost nothing here,
//! and their gradient is zero anyway.

use rayon::prelude::*;

use super::adapters::{linear, linear_t};
use super::ops;
use super::CpuTrainer;
use crate::error::{Result, TrainError};
use crate::gpu::Rows;

/// Bytes of logits per chunk of rows, at most.
const LOGITS_BYTES: usize = 64 << 20;

/// Loss and gradient of one row of logits in place: `w · (lse − logit[label])`, and the row
/// becomes `w · (softmax − onehot(label))`.
fn cross_entropy(row: &mut [f32], label: usize, w: f32) -> f64 {
    let mx = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let sum: f64 = row.iter().map(|&x| f64::from((x - mx).exp())).sum();
    let lse = f64::from(mx) + sum.ln();
    let loss = f64::from(w) * (lse - f64::from(row[label]));
    let lse = lse as f32;
    for x in row.iter_mut() {
        *x = w * (*x - lse).exp();
    }
    row[label] -= w;
    loss
}

impl CpuTrainer {
    /// The weighted loss sum of the rows whose final residual stream is `x`; with `train`
    /// also ∂L/∂x.
    pub(crate) fn head(&self, x: &[f32], r: &Rows, train: bool) -> Result<(f64, Option<Vec<f32>>)> {
        let (d, nv, eps) = (self.c.n_embd, self.c.n_vocab, self.c.rms_eps);
        let mut nf = vec![0f32; x.len()];
        ops::rms_norm(x, &self.base.out_norm, &mut nf, d, eps);
        let sel: Vec<usize> = (0..self.rows)
            .filter(|&i| (r.labels[i] as usize) < nv && r.weights[i] != 0.0)
            .collect();
        let mut dnf = train.then(|| vec![0f32; x.len()]);
        let chunk = (LOGITS_BYTES / (4 * nv)).max(1);
        let mut total = 0f64;
        for rows in sel.chunks(chunk) {
            let mut xs = Vec::with_capacity(rows.len() * d);
            for &i in rows {
                xs.extend_from_slice(&nf[i * d..(i + 1) * d]);
            }
            let mut logits = vec![0f32; rows.len() * nv];
            linear(&self.base.output, &xs, &mut logits, None);
            let losses: Vec<f64> = logits
                .par_chunks_mut(nv)
                .zip(rows.par_iter())
                .map(|(row, &i)| cross_entropy(row, r.labels[i] as usize, r.weights[i]))
                .collect();
            if let Some(k) = losses.iter().position(|l| !l.is_finite()) {
                return Err(TrainError::NonFinite(format!(
                    "the loss of row {} is {}",
                    rows[k], losses[k]
                )));
            }
            total += losses.iter().sum::<f64>();
            if let Some(dnf) = dnf.as_mut() {
                let mut dxs = vec![0f32; xs.len()];
                linear_t(&self.base.output, &logits, &mut dxs, false);
                for (k, &i) in rows.iter().enumerate() {
                    dnf[i * d..(i + 1) * d].copy_from_slice(&dxs[k * d..(k + 1) * d]);
                }
            }
        }
        let dx = dnf.map(|dnf| {
            let mut dx = vec![0f32; x.len()];
            ops::rms_norm_back(x, &self.base.out_norm, &dnf, &mut dx, d, eps, false);
            dx
        });
        Ok((total, dx))
    }
}
