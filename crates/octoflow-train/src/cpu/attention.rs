//! Causal attention of a training batch and its backward, one task per (sequence, key head):
//! the heads sharing a key head are done together so their key and value gradients add up
//! inside one task. Row `i` of a sequence sees rows `i - pos[i] ..= i` (its own document; a
//! sliding window narrows that), as the GPU's masked softmax does.

use rayon::prelude::*;

use super::gemm::{gemm1, Out, View};

/// The shapes of one layer's attention over a batch.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub batch: usize,
    pub seq: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub hdv: usize,
    /// Applied to the scores inside the softmax.
    pub scale: f32,
    /// Sliding window (0: none).
    pub window: usize,
}

impl Shape {
    fn group(&self) -> usize {
        self.n_head / self.n_kv
    }
    fn qd(&self) -> usize {
        self.n_head * self.hd
    }
    fn kd(&self) -> usize {
        self.n_kv * self.hd
    }
    fn vd(&self) -> usize {
        self.n_kv * self.hdv
    }
    fn ad(&self) -> usize {
        self.n_head * self.hdv
    }
    /// Floats of the probabilities `[batch, n_head, seq, seq]`.
    pub fn probs(&self) -> usize {
        self.batch * self.n_head * self.seq * self.seq
    }

    /// The keys row `i` of sequence `b` sees.
    fn visible(&self, pos: &[u32], b: usize, i: usize) -> std::ops::Range<usize> {
        let p = pos[b * self.seq + i] as usize;
        let mut lo = i - p.min(i);
        if self.window > 0 {
            lo = lo.max((i + 1).saturating_sub(self.window));
        }
        lo..i + 1
    }
}

/// Forward: fills `probs` `[batch, n_head, seq, seq]` and `att` `[T, n_head · hdv]` from
/// `q` `[T, n_head · hd]`, `k` `[T, n_kv · hd]`, `v` `[T, n_kv · hdv]`.
pub(crate) fn forward(
    sh: &Shape,
    pos: &[u32],
    (q, k, v): (&[f32], &[f32], &[f32]),
    probs: &mut [f32],
    att: &mut [f32],
) {
    let (s, g, ss) = (sh.seq, sh.group(), sh.seq * sh.seq);
    let (qd, kd, vd, ad) = (sh.qd(), sh.kd(), sh.vd(), sh.ad());
    // one block of g heads' outputs [seq, g · hdv] per task, placed afterwards
    let blocks: Vec<Vec<f32>> = probs
        .par_chunks_mut(g * ss)
        .enumerate()
        .map(|(task, p)| {
            let (b, kh) = (task / sh.n_kv, task % sh.n_kv);
            let row0 = b * s;
            let kv = View {
                data: &k[row0 * kd + kh * sh.hd..],
                rs: 1,
                cs: kd,
            };
            let vv = View::rows(&v[row0 * vd + kh * sh.hdv..], vd);
            let mut out = vec![0f32; s * g * sh.hdv];
            for (j, ph) in p.chunks_exact_mut(ss).enumerate() {
                let h = kh * g + j;
                let qv = View::rows(&q[row0 * qd + h * sh.hd..], qd);
                gemm1([s, s, sh.hd], 1.0, qv, kv, 0.0, Out { data: ph, ld: s });
                for (i, row) in ph.chunks_exact_mut(s).enumerate() {
                    softmax_row(row, sh.visible(pos, b, i), sh.scale);
                }
                let o = Out {
                    data: &mut out[j * sh.hdv..],
                    ld: g * sh.hdv,
                };
                gemm1([s, sh.hdv, s], 1.0, View::rows(ph, s), vv, 0.0, o);
            }
            out
        })
        .collect();
    for (task, out) in blocks.iter().enumerate() {
        let (b, kh) = (task / sh.n_kv, task % sh.n_kv);
        let w = g * sh.hdv;
        for (i, r) in out.chunks_exact(w).enumerate() {
            let at = (b * s + i) * ad + kh * w;
            att[at..at + w].copy_from_slice(r);
        }
    }
}

/// `row = softmax(scale · row)` over `seen`, 0 elsewhere.
fn softmax_row(row: &mut [f32], seen: std::ops::Range<usize>, scale: f32) {
    let mx = row[seen.clone()]
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| m.max(scale * x));
    let mut sum = 0f64;
    for x in &mut row[seen.clone()] {
        *x = (scale * *x - mx).exp();
        sum += f64::from(*x);
    }
    let inv = (1.0 / sum) as f32;
    for (j, x) in row.iter_mut().enumerate() {
        *x = if seen.contains(&j) { *x * inv } else { 0.0 };
    }
}

/// Backward: from `datt` (∂L/∂att) and the forward's `probs`, `q`, `k`, `v`, writes `dq`,
/// `dk`, `dv` (overwritten).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    sh: &Shape,
    pos: &[u32],
    (q, k, v): (&[f32], &[f32], &[f32]),
    probs: &[f32],
    datt: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let (s, g, ss) = (sh.seq, sh.group(), sh.seq * sh.seq);
    let (qd, kd, vd, ad) = (sh.qd(), sh.kd(), sh.vd(), sh.ad());
    let (hd, hdv) = (sh.hd, sh.hdv);
    type Blocks = (Vec<f32>, Vec<f32>, Vec<f32>);
    let blocks: Vec<Blocks> = probs
        .par_chunks(g * ss)
        .enumerate()
        .map(|(task, p)| {
            let (b, kh) = (task / sh.n_kv, task % sh.n_kv);
            let row0 = b * s;
            let krows = View::rows(&k[row0 * kd + kh * hd..], kd);
            let vt = View {
                data: &v[row0 * vd + kh * hdv..],
                rs: 1,
                cs: vd,
            };
            let (mut bq, mut bk, mut bv) = (
                vec![0f32; s * g * hd],
                vec![0f32; s * hd],
                vec![0f32; s * hdv],
            );
            let mut ds = vec![0f32; ss];
            for (j, ph) in p.chunks_exact(ss).enumerate() {
                let h = kh * g + j;
                let dout = View::rows(&datt[row0 * ad + h * hdv..], ad);
                let beta = if j == 0 { 0.0 } else { 1.0 };
                // dP = dO Vᵀ ; dV += Pᵀ dO
                gemm1(
                    [s, s, hdv],
                    1.0,
                    dout,
                    vt,
                    0.0,
                    Out {
                        data: &mut ds,
                        ld: s,
                    },
                );
                let pt = View::t(ph, s);
                gemm1(
                    [s, hdv, s],
                    1.0,
                    pt,
                    dout,
                    beta,
                    Out {
                        data: &mut bv,
                        ld: hdv,
                    },
                );
                // dS = scale · P ∘ (dP − Σ_j P dP), zero where P is (masked keys)
                for (i, (dr, pr)) in ds.chunks_exact_mut(s).zip(ph.chunks_exact(s)).enumerate() {
                    let seen = sh.visible(pos, b, i);
                    let dot: f64 = seen
                        .clone()
                        .map(|c| f64::from(pr[c]) * f64::from(dr[c]))
                        .sum();
                    let dot = dot as f32;
                    for (c, (d, &pv)) in dr.iter_mut().zip(pr).enumerate() {
                        *d = if seen.contains(&c) {
                            sh.scale * pv * (*d - dot)
                        } else {
                            0.0
                        };
                    }
                }
                // dQ = dS K ; dK += dSᵀ Q
                let o = Out {
                    data: &mut bq[j * hd..],
                    ld: g * hd,
                };
                gemm1([s, hd, s], 1.0, View::rows(&ds, s), krows, 0.0, o);
                let qrows = View::rows(&q[row0 * qd + h * hd..], qd);
                let dst = View::t(&ds, s);
                gemm1(
                    [s, hd, s],
                    1.0,
                    dst,
                    qrows,
                    beta,
                    Out {
                        data: &mut bk,
                        ld: hd,
                    },
                );
            }
            (bq, bk, bv)
        })
        .collect();
    for (task, (bq, bk, bv)) in blocks.iter().enumerate() {
        let (b, kh) = (task / sh.n_kv, task % sh.n_kv);
        for i in 0..s {
            let r = b * s + i;
            let w = g * hd;
            dq[r * qd + kh * w..r * qd + (kh + 1) * w].copy_from_slice(&bq[i * w..(i + 1) * w]);
            dk[r * kd + kh * hd..r * kd + (kh + 1) * hd].copy_from_slice(&bk[i * hd..(i + 1) * hd]);
            dv[r * vd + kh * hdv..r * vd + (kh + 1) * hdv]
                .copy_from_slice(&bv[i * hdv..(i + 1) * hdv]);
        }
    }
}
