//! Softmax cross-entropy loss and its gradient, in place (shader `cross_entropy.comp`): per row
//! `r` of logits `[n_rows, n_vocab]` f32 with label `l` and weight `w`,
//! `loss[r] = w · (logsumexp(logits[r]) − logits[r][l])` and `logits[r] ← w · (softmax(logits[r])
//! − onehot(l))`; rows whose label is [`IGNORE`] (or any id `>= n_vocab`) get loss 0 and gradient 0.

use octoflow_vk::{BufferSlice, Chain, Context, Pipeline, PipelineDesc, Push};

use crate::error::Result;
use crate::operand::{bad, need};
use crate::shaders;

const OP: &str = "cross_entropy";

/// Label value meaning "no loss on this row".
pub const IGNORE: u32 = u32::MAX;

/// The operands of one loss computation (see the module doc).
pub struct CrossEntropyArgs<'a> {
    /// [n_rows, n_vocab] f32 logits; replaced in place by d(loss)/d(logits).
    pub logits: &'a BufferSlice,
    /// u32 labels, row r's at labels[labels_offset + r]; IGNORE (or any id >= n_vocab) = no loss, zero gradient.
    pub labels: &'a BufferSlice,
    /// Index in `labels` of row 0's label.
    pub labels_offset: u32,
    /// f32 per-row loss weights, row r's at weights[weights_offset + r].
    pub weights: &'a BufferSlice,
    /// Index in `weights` of row 0's weight.
    pub weights_offset: u32,
    /// [n_rows] f32 out: weight * (logsumexp(logits[r]) - logits[r][label]), 0 for ignored rows.
    pub loss: &'a BufferSlice,
    /// Rows (tokens) of `logits`.
    pub n_rows: u32,
    /// Vocabulary size (columns of `logits`).
    pub n_vocab: u32,
}

/// The cross-entropy kernel (one workgroup per row), built once per device.
pub struct CrossEntropy {
    pipeline: Pipeline,
}

impl CrossEntropy {
    /// Builds the pipeline.
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(CrossEntropy {
            pipeline: Pipeline::new(ctx, &PipelineDesc::new(shaders::CROSS_ENTROPY, 4, 16))?,
        })
    }

    /// Records the loss and the in-place gradient of `n_rows` rows. Checks the shape and every
    /// operand's size. `loss` must not alias the other operands.
    pub fn record(&self, chain: &mut Chain, a: &CrossEntropyArgs) -> Result<()> {
        if a.n_rows == 0 || a.n_vocab == 0 {
            return Err(bad(
                OP,
                format!("empty shape: {} rows of {}", a.n_rows, a.n_vocab),
            ));
        }
        let rows = u128::from(a.n_rows);
        let total = rows * u128::from(a.n_vocab);
        if 4 * total > u128::from(u32::MAX) {
            return Err(bad(
                OP,
                format!(
                    "logits: {} x {} floats exceed the shader's 32-bit indices",
                    a.n_rows, a.n_vocab
                ),
            ));
        }
        need(OP, "logits", a.logits, total)?;
        need(OP, "labels", a.labels, u128::from(a.labels_offset) + rows)?;
        need(
            OP,
            "weights",
            a.weights,
            u128::from(a.weights_offset) + rows,
        )?;
        need(OP, "loss", a.loss, rows)?;
        let groups = chain.context().groups_1d(u64::from(a.n_rows), 1)?;
        let push = Push::new()
            .u32(a.n_rows)
            .u32(a.n_vocab)
            .u32(a.labels_offset)
            .u32(a.weights_offset);
        let bindings = [
            a.logits.clone(),
            a.labels.clone(),
            a.weights.clone(),
            a.loss.clone(),
        ];
        chain.dispatch(&self.pipeline, &bindings, &push, groups)?;
        Ok(())
    }
}

/// gradient = weight * (softmax(logits[r]) - onehot(label)); f64 reference.
///
/// `logits`: `[n_rows, n_vocab]` (n_rows = `loss.len()`), replaced by the gradient; `labels`,
/// `weights`, `loss`: one per row. `loss[r] = weight · (logsumexp(logits[r]) − logits[r][label])`;
/// a label `>= n_vocab` ([`IGNORE`]) gives loss 0 and a zero gradient row.
pub fn cross_entropy_ref(
    logits: &mut [f32],
    labels: &[u32],
    weights: &[f32],
    loss: &mut [f32],
    n_vocab: usize,
) {
    for (r, row) in logits
        .chunks_exact_mut(n_vocab)
        .enumerate()
        .take(loss.len())
    {
        let label = labels[r] as usize;
        if label >= n_vocab {
            row.fill(0.0);
            loss[r] = 0.0;
            continue;
        }
        let w = f64::from(weights[r]);
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
        let sum: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
        let lse = max + sum.ln();
        loss[r] = (w * (lse - f64::from(row[label]))) as f32;
        for (i, x) in row.iter_mut().enumerate() {
            let p = (f64::from(*x) - lse).exp();
            let onehot = if i == label { 1.0 } else { 0.0 };
            *x = (w * (p - onehot)) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
    use rand::rngs::StdRng;
    use rand::Rng;

    use super::*;
    use crate::check_close;
    use crate::testkit::{poisoned, read, with};

    /// Losses: `log1p(sum_ex / e_label)` (or `log(sum) + max − x_label` when the label's
    /// term is negligible) in f32, the sums of up to ~600 exps per invocation and a tree across
    /// the workgroup: ~1e-6 relative (measured on lavapipe: up to 8e-7).
    const REL_LOSS: f32 = 2e-5;
    /// Gradients: `exp(x − max) / sum` is a few ulps plus the sum's relative error (~1e-6 on
    /// 152k-wide rows); the label's `p − 1` is `−sum_ex / sum`, the sum of the other terms, as
    /// precise (computed as `p − 1` it was off by ~1e-7 absolute: 1.6e-4 relative on the H100
    /// for a confident row, p = 0.9986, in 2 of 150 random runs); check_close's floor (1% of the
    /// largest, ~|weight|) keeps the relative bound meaningful for the tiny probabilities
    /// (measured on lavapipe: typically up to 2e-6 on 50-wide rows, once 2.3e-5 — a row of
    /// ±30 logits, where `x − max` reaches ~60 and its f32 rounding alone moves `exp` by ~4e-6,
    /// times a few ulps of llvmpipe's `exp`): 1e-4.
    const REL_GRAD: f32 = 1e-4;

    /// Random logits for row `r` of `n_vocab`: ordinary (−8..8), large-magnitude (±30) or a
    /// confident row whose label holds a clear maximum.
    fn row_logits(rng: &mut StdRng, kind: usize, n_vocab: usize, label: u32) -> Vec<f32> {
        let mut row: Vec<f32> = (0..n_vocab)
            .map(|_| match kind % 3 {
                0 => rng.gen_range(-8.0..8.0),
                _ => rng.gen_range(-30.0..30.0),
            })
            .collect();
        if kind % 3 == 2 && (label as usize) < n_vocab {
            row[label as usize] = 30.0 + rng.gen_range(0.0..5.0);
        }
        row
    }

    #[test]
    fn gpu_cross_entropy_matches_the_reference_on_random_inputs() {
        let Some(ctx) = gpu_or_skip("gpu_cross_entropy_matches_the_reference") else {
            return;
        };
        let (seed, mut rng) = crate::testkit::seeded(module_path!());
        let k = CrossEntropy::new(&ctx).unwrap();
        for (n_rows, n_vocab) in [(7usize, 50usize), (6, 1000), (3, 49_152), (3, 151_936)] {
            // row 1 ignored (IGNORE), row 4 an out-of-range id (also ignored) where present
            let labels: Vec<u32> = (0..n_rows)
                .map(|r| match r {
                    1 => IGNORE,
                    4 => n_vocab as u32 + 3,
                    _ => rng.gen_range(0..n_vocab as u32),
                })
                .collect();
            let weights: Vec<f32> = (0..n_rows).map(|_| rng.gen_range(0.1..2.5)).collect();
            let mut logits = Vec::with_capacity(n_rows * n_vocab);
            for (r, &l) in labels.iter().enumerate() {
                logits.extend(row_logits(&mut rng, r, n_vocab, l));
            }
            // operands at offsets inside larger buffers
            let (lo, wo) = (rng.gen_range(0..5usize), rng.gen_range(0..5usize));
            let mut lab_buf = vec![7u32; lo + n_rows + 2];
            lab_buf[lo..lo + n_rows].copy_from_slice(&labels);
            let mut w_buf = vec![f32::NAN; wo + n_rows + 2];
            w_buf[wo..wo + n_rows].copy_from_slice(&weights);
            let xb = with(&ctx, "logits", &logits);
            let lb = with(&ctx, "labels", &lab_buf);
            let wb = with(&ctx, "weights", &w_buf);
            let ob = poisoned(&ctx, "loss", n_rows);
            let args = CrossEntropyArgs {
                logits: &xb.whole(),
                labels: &lb.whole(),
                labels_offset: lo as u32,
                weights: &wb.whole(),
                weights_offset: wo as u32,
                loss: &ob.whole(),
                n_rows: n_rows as u32,
                n_vocab: n_vocab as u32,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(&mut chain, &args).unwrap();
            chain.run().unwrap();
            let mut want_grad = logits.clone();
            let mut want_loss = vec![0f32; n_rows];
            cross_entropy_ref(&mut want_grad, &labels, &weights, &mut want_loss, n_vocab);
            let what = format!("{n_rows} x {n_vocab}, labels {labels:?}, seed {seed}");
            let got_loss = read(&ctx, &ob, n_rows);
            if let Err(e) = check_close(&got_loss, &want_loss, REL_LOSS) {
                panic!("cross_entropy loss {what}: {e}");
            }
            let got_grad = read(&ctx, &xb, n_rows * n_vocab);
            for r in 0..n_rows {
                let span = r * n_vocab..(r + 1) * n_vocab;
                let (g, w) = (&got_grad[span.clone()], &want_grad[span]);
                if let Err(e) = check_close(g, w, REL_GRAD) {
                    panic!("cross_entropy gradient of row {r}, {what}: {e}");
                }
                if labels[r] as usize >= n_vocab {
                    assert!(g.iter().all(|&v| v == 0.0) && got_loss[r] == 0.0, "{what}");
                }
            }
        }
        assert_no_validation_errors(&ctx);
    }

    #[test]
    fn bad_shapes_are_clear_errors() {
        let Some(ctx) = gpu_or_skip("cross_entropy_bad_shapes") else {
            return;
        };
        let k = CrossEntropy::new(&ctx).unwrap();
        let x = poisoned(&ctx, "logits", 4 * 100);
        let labels = with(&ctx, "labels", &[0u32; 4]);
        let weights = poisoned(&ctx, "weights", 4);
        let loss = poisoned(&ctx, "loss", 3);
        let (xs, ls, ws, os) = (x.whole(), labels.whole(), weights.whole(), loss.whole());
        let err = |labels_offset, weights_offset, n_rows, n_vocab, loss: &BufferSlice| {
            let a = CrossEntropyArgs {
                logits: &xs,
                labels: &ls,
                labels_offset,
                weights: &ws,
                weights_offset,
                loss,
                n_rows,
                n_vocab,
            };
            let mut chain = Chain::new(&ctx).unwrap();
            k.record(&mut chain, &a).unwrap_err().to_string()
        };
        let e = err(0, 0, 3, 134, &os);
        assert!(e.contains("logits") && e.contains("402 values"), "{e}");
        let e = err(2, 0, 3, 100, &os);
        assert!(e.contains("labels") && e.contains("5 values"), "{e}");
        let e = err(0, 1, 4, 100, &xs);
        assert!(e.contains("weights") && e.contains("5 values"), "{e}");
        let e = err(0, 0, 3, 0, &os);
        assert!(e.contains("empty shape"), "{e}");
        let os2 = loss.slice(0, 8).unwrap();
        let e = err(0, 0, 3, 100, &os2);
        assert!(e.contains("loss") && e.contains("3 values"), "{e}");
    }
}
