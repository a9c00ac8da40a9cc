//! `C = alpha · A B + beta · C` on f32 with arbitrary strides (so transposes cost nothing),
//! split over rayon's threads along the larger output dimension, each part a call to
//! `matrixmultiply`'s cache-blocked kernel (runtime AVX/FMA dispatch).

use rayon::prelude::*;

/// Below this many multiply-adds a product runs on the calling thread: splitting costs more.
const SERIAL_MACS: usize = 1 << 18;

/// A read-only matrix operand: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> View<'a> {
    /// A row-major `[_, cols]` matrix.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        View {
            data,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose of a row-major `[_, cols]` matrix.
    pub fn t(data: &'a [f32], cols: usize) -> Self {
        View {
            data,
            rs: 1,
            cs: cols,
        }
    }

    /// Whether every element of an `[r, c]` matrix lies inside `data`.
    fn covers(&self, r: usize, c: usize) -> bool {
        r == 0 || c == 0 || (r - 1) * self.rs + (c - 1) * self.cs < self.data.len()
    }
}

/// The output: row-major with row stride `ld` (`ld ≥ n`).
pub(crate) struct Out<'a> {
    pub data: &'a mut [f32],
    pub ld: usize,
}

/// A pointer the parts of one product share; each part writes a disjoint block of `C`.
#[derive(Clone, Copy)]
struct Shared(*mut f32);
// SAFETY: the parts of `gemm` write disjoint blocks of C (see there); nothing else touches C
// while they run because `gemm` holds its only mutable borrow.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

/// `C[m, n] = alpha · A[m, k] · B[k, n] + beta · C` (`beta = 0` overwrites, NaNs included),
/// split over the threads.
///
/// # Panics
/// When an operand is smaller than its shape says (a programming error, not user input).
pub(crate) fn gemm(mnk: [usize; 3], alpha: f32, a: View, b: View, beta: f32, c: Out) {
    product(mnk, alpha, a, b, beta, c, true);
}

/// [`gemm`] on the calling thread (inside tasks that are already parallel).
pub(crate) fn gemm1(mnk: [usize; 3], alpha: f32, a: View, b: View, beta: f32, c: Out) {
    product(mnk, alpha, a, b, beta, c, false);
}

fn product([m, n, k]: [usize; 3], alpha: f32, a: View, b: View, beta: f32, c: Out, parallel: bool) {
    assert!(a.covers(m, k) && b.covers(k, n), "gemm operand too small");
    assert!(c.ld >= n && (m == 0 || n == 0 || (m - 1) * c.ld + n <= c.data.len()));
    if m == 0 || n == 0 {
        return;
    }
    let cp = Shared(c.data.as_mut_ptr());
    let ld = c.ld;
    // part [i0, i1) × [j0, j1) of C
    let part = |(i0, i1): (usize, usize), (j0, j1): (usize, usize)| {
        let p = cp;
        // SAFETY: the asserts above put every element the strides reach inside the slices;
        // parts cover disjoint blocks of C, so no two threads write the same element.
        unsafe {
            matrixmultiply::sgemm(
                i1 - i0,
                k,
                j1 - j0,
                alpha,
                a.data.as_ptr().add(i0 * a.rs),
                a.rs as isize,
                a.cs as isize,
                b.data.as_ptr().add(j0 * b.cs),
                b.rs as isize,
                b.cs as isize,
                beta,
                p.0.add(i0 * ld + j0),
                ld as isize,
                1,
            );
        }
    };
    let threads = rayon::current_num_threads();
    if !parallel || threads == 1 || m * n * k < SERIAL_MACS {
        part((0, m), (0, n));
        return;
    }
    // the larger dimension in chunks of whole register tiles (multiples of 16)
    let (len, split_rows) = if m >= n { (m, true) } else { (n, false) };
    let chunk = len.div_ceil(threads).div_ceil(16) * 16;
    (0..len.div_ceil(chunk)).into_par_iter().for_each(|p| {
        let r = (p * chunk, ((p + 1) * chunk).min(len));
        if split_rows {
            part(r, (0, n));
        } else {
            part((0, m), r);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn naive(m: usize, n: usize, k: usize, a: View, b: View) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k)
                    .map(|p| {
                        f64::from(a.data[i * a.rs + p * a.cs])
                            * f64::from(b.data[p * b.rs + j * b.cs])
                    })
                    .sum();
            }
        }
        c
    }

    /// Every transpose combination, shapes large enough to be split over threads and odd
    /// enough that the parts are uneven, with beta both 0 (over NaN) and 1.
    #[test]
    fn matches_the_definition_for_every_layout() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for &(m, n, k) in &[(3, 5, 7), (70, 300, 33), (301, 45, 40), (17, 1, 64)] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            for (at, bt) in [(false, false), (true, false), (false, true), (true, true)] {
                let av = if at {
                    View::t(&a, m)
                } else {
                    View::rows(&a, k)
                };
                let bv = if bt {
                    View::t(&b, k)
                } else {
                    View::rows(&b, n)
                };
                let want = naive(m, n, k, av, bv);
                for beta in [0.0f32, 1.0] {
                    let start = if beta == 0.0 { f32::NAN } else { 0.5 };
                    let ld = n + 3;
                    let mut c = vec![start; m * ld];
                    gemm([m, n, k], 2.0, av, bv, beta, Out { data: &mut c, ld });
                    for i in 0..m {
                        for j in 0..n {
                            let w = 2.0 * want[i * n + j] + f64::from(beta) * 0.5;
                            let got = f64::from(c[i * ld + j]);
                            assert!(
                                (got - w).abs() <= 1e-5 * (1.0 + w.abs()) * (k as f64).sqrt(),
                                "{m}x{n}x{k} at={at} bt={bt} beta={beta}: c[{i},{j}] = {got}, want {w}"
                            );
                        }
                        // the padding between rows is never written
                        for j in n..ld {
                            let v = c[i * ld + j];
                            assert!(v.is_nan() || v == 0.5, "padding written");
                        }
                    }
                }
            }
        }
    }
}
