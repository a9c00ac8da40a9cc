//! Device tests of `gemm.rs`.

use octoflow_vk::testing::{assert_no_validation_errors, gpu_or_skip};
use octoflow_vk::{Buffer, MemoryKind};
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::check_close;
use crate::testkit::random;

/// The shader sums k*groups products (at most 600 here) in f32 with one rounding per fma,
/// against the f64 reference. Inputs in [-1, 1]: a partial sum after t terms is ~√t/3, so
/// the accumulated rounding error is ~2^-24 * K / 15 ≈ 2.5e-6 (1σ, K = 600) absolute, while
/// check_close's floor is 1% of max|C| (≈ 4√K/3 ≈ 33, floor ≈ 0.3): ~1e-5 relative for the
/// worst of thousands of elements. alpha and beta add one rounding each. 1e-4 leaves ~5x
/// margin (measured up to 2.1e-5 on lavapipe) and still fails on any indexing error (those are
/// O(1) wrong).
const REL: f32 = 1e-4;

/// Both tile variants (the CPU driver's 32 and the GPU's 64), whatever the device.
fn variants(ctx: &Context) -> Vec<Gemm> {
    [32, 64]
        .iter()
        .map(|&t| Gemm::with_tile(ctx, t).unwrap())
        .collect()
}

/// Elements needed to hold index `Σ (count - 1) * stride`.
fn span(axes: &[(usize, u32)]) -> usize {
    1 + axes
        .iter()
        .map(|&(count, stride)| (count - 1) * stride as usize)
        .sum::<usize>()
}

/// Strides of one `rows` x `cols` (logical) matrix, stored row-major with `pad` extra
/// elements per stored row, or transposed (`t`); and the stored matrix's size.
fn layout(rows: usize, cols: usize, t: bool, pad: usize) -> (Strides, usize) {
    if t {
        let ld = rows + pad;
        let s = Strides {
            row: 1,
            col: ld as u32,
            ..Strides::default()
        };
        (s, cols * ld)
    } else {
        let ld = cols + pad;
        let s = Strides {
            row: ld as u32,
            col: 1,
            ..Strides::default()
        };
        (s, rows * ld)
    }
}

/// One product with its host data; `c` is C's content before the run.
struct Case {
    a: Vec<f32>,
    a_s: Strides,
    b: Vec<f32>,
    b_s: Strides,
    b_div: u32,
    c: Vec<f32>,
    c_row: u32,
    c_batch: [u32; 2],
    m: usize,
    n: usize,
    k: usize,
    groups: usize,
    batch: [usize; 2],
    alpha: f32,
    beta: f32,
}

/// Dimensions of a [`Case::packed`] product: `(m, n, k, groups, batch, b_div)`.
type Dims = (usize, usize, usize, usize, [usize; 2], u32);

impl Case {
    /// Stacked matrices (group fastest, then b2, then b1), A transposed when `ta`, B when
    /// `tb`, random row padding; C is NaN when `beta` is 0, else random.
    fn packed(rng: &mut StdRng, d: Dims, ta: bool, tb: bool, alpha: f32, beta: f32) -> Case {
        let (m, n, k, groups, batch, b_div) = d;
        let b_inner = (batch[1] - 1) / b_div as usize + 1;
        let (mut a_s, a_size) = layout(m, k, ta, rng.gen_range(0..3));
        a_s.group = a_size as u32;
        a_s.batch = [
            (batch[1] * groups * a_size) as u32,
            (groups * a_size) as u32,
        ];
        let (mut b_s, b_size) = layout(k, n, tb, rng.gen_range(0..3));
        b_s.group = b_size as u32;
        b_s.batch = [(b_inner * groups * b_size) as u32, (groups * b_size) as u32];
        let c_row = (n + rng.gen_range(0..3)) as u32;
        let c_batch = [batch[1] as u32 * m as u32 * c_row, m as u32 * c_row];
        let a_len = span(&[
            (batch[0], a_s.batch[0]),
            (batch[1], a_s.batch[1]),
            (groups, a_s.group),
            (m, a_s.row),
            (k, a_s.col),
        ]);
        let b_len = span(&[
            (batch[0], b_s.batch[0]),
            (b_inner, b_s.batch[1]),
            (groups, b_s.group),
            (k, b_s.row),
            (n, b_s.col),
        ]);
        let c_len = span(&[
            (batch[0], c_batch[0]),
            (batch[1], c_batch[1]),
            (m, c_row),
            (n, 1),
        ]);
        Case {
            a: random(rng, a_len),
            a_s,
            b: random(rng, b_len),
            b_s,
            b_div,
            c: if beta == 0.0 {
                vec![f32::NAN; c_len]
            } else {
                random(rng, c_len)
            },
            c_row,
            c_batch,
            m,
            n,
            k,
            groups,
            batch,
            alpha,
            beta,
        }
    }

    /// Runs the case on the device (each operand at a nonzero slice offset, NaN before it)
    /// and compares with `gemm_ref`; elements of C outside the product must keep their bits.
    fn check(&self, ctx: &Context, gemm: &Gemm, what: &str, seed: u64) {
        let pre = ctx.caps().storage_offset_alignment.max(16);
        let at = |name: &str, data: &[f32]| {
            let bytes = 4 * data.len() as u64;
            let buf = Buffer::new(ctx, name, pre + bytes, MemoryKind::DeviceLocal).unwrap();
            ctx.fill(&buf, 0, pre, f32::NAN.to_bits()).unwrap();
            ctx.upload(&buf, pre, data).unwrap();
            let slice = buf.slice(pre, bytes).unwrap();
            (buf, slice)
        };
        let (_ab, a) = at("a", &self.a);
        let (_bb, b) = at("b", &self.b);
        let (cb, c) = at("c", &self.c);
        let args = GemmArgs {
            a: &a,
            a_s: self.a_s,
            b: &b,
            b_s: self.b_s,
            b_div: self.b_div,
            c: &c,
            c_row: self.c_row,
            c_batch: self.c_batch,
            m: self.m as u32,
            n: self.n as u32,
            k: self.k as u32,
            groups: self.groups as u32,
            batch: self.batch.map(|x| x as u32),
            alpha: self.alpha,
            beta: self.beta,
        };
        let mut chain = Chain::new(ctx).unwrap();
        gemm.record(&mut chain, &args).unwrap();
        chain.run().unwrap();
        let mut got = vec![0f32; self.c.len()];
        ctx.download(&cb, pre, &mut got).unwrap();

        let mut want = self.c.clone();
        gemm_ref(
            &self.a,
            self.a_s,
            &self.b,
            self.b_s,
            self.b_div,
            &mut want,
            self.c_row,
            self.c_batch,
            self.m,
            self.n,
            self.k,
            self.groups,
            self.batch,
            self.alpha,
            self.beta,
        );
        let mut touched = vec![false; self.c.len()];
        for b1 in 0..self.batch[0] {
            for b2 in 0..self.batch[1] {
                for i in 0..self.m {
                    let row = b1 * self.c_batch[0] as usize
                        + b2 * self.c_batch[1] as usize
                        + i * self.c_row as usize;
                    touched[row..row + self.n]
                        .iter_mut()
                        .for_each(|t| *t = true);
                }
            }
        }
        let pick = |v: &[f32], t: bool| -> Vec<f32> {
            v.iter()
                .zip(&touched)
                .filter(|(_, &x)| x == t)
                .map(|(&y, _)| y)
                .collect()
        };
        let shape = format!(
            "{what} (tile {}): m {} n {} k {} groups {} batch {:?} b_div {} alpha {} beta {}, seed {seed}",
            gemm.tile, self.m, self.n, self.k, self.groups, self.batch, self.b_div, self.alpha,
            self.beta
        );
        if let Err(e) = check_close(&pick(&got, true), &pick(&want, true), REL) {
            panic!("gemm {shape}: {e}");
        }
        let kept = pick(&got, false)
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>();
        let before = pick(&self.c, false)
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>();
        assert_eq!(kept, before, "gemm {shape}: wrote outside the product");
        assert_no_validation_errors(ctx);
    }
}

const TRANSPOSES: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

#[test]
fn gpu_gemm_all_transposes_and_lora_shapes() {
    let Some(ctx) = gpu_or_skip("gpu_gemm_all_transposes_and_lora_shapes") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let random_mnk = (
        rng.gen_range(1..90),
        rng.gen_range(1..90),
        rng.gen_range(1..90),
    );
    for gemm in variants(&ctx) {
        for (ta, tb) in TRANSPOSES {
            for (m, n, k) in [(37, 8, 96), (37, 96, 8), random_mnk] {
                let case = Case::packed(&mut rng, (m, n, k, 1, [1, 1], 1), ta, tb, 1.0, 0.0);
                case.check(&ctx, &gemm, &format!("ta {ta} tb {tb}"), seed);
            }
        }
    }
}

#[test]
fn gpu_gemm_edge_sizes_overwrite_nan_with_beta_zero() {
    let Some(ctx) = gpu_or_skip("gpu_gemm_edge_sizes") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    for gemm in variants(&ctx) {
        for (m, n, k, batch) in [
            (1, 1, 1, [1, 1]),
            (65, 33, 17, [1, 1]),
            (130, 3, 200, [1, 1]),
            (1, 70, 5, [2, 1]),
            (64, 64, 16, [1, 2]),
        ] {
            let (ta, tb) = (rng.gen(), rng.gen());
            // beta == 0: C starts NaN and must be overwritten without being read.
            let case = Case::packed(&mut rng, (m, n, k, 1, batch, 1), ta, tb, 1.0, 0.0);
            case.check(&ctx, &gemm, &format!("edge ta {ta} tb {tb}"), seed);
        }
    }
}

#[test]
fn gpu_gemm_batched_grouped_and_accumulating() {
    let Some(ctx) = gpu_or_skip("gpu_gemm_batched_grouped_and_accumulating") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    for gemm in variants(&ctx) {
        for (d, alpha, beta) in [
            ((23, 41, 30, 3, [2, 3], 3), 0.75, 0.0),
            ((40, 9, 70, 3, [1, 4], 2), -1.5, 1.0),
            ((17, 66, 12, 2, [3, 2], 1), 2.0, 0.5),
            ((33, 20, 100, 1, [2, 2], 2), 1.0, 1.0),
        ] {
            let (ta, tb) = (rng.gen(), rng.gen());
            let case = Case::packed(&mut rng, d, ta, tb, alpha, beta);
            case.check(&ctx, &gemm, &format!("batched ta {ta} tb {tb}"), seed);
        }
    }
}

#[test]
fn gpu_gemm_random_cases() {
    let Some(ctx) = gpu_or_skip("gpu_gemm_random_cases") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    for gemm in variants(&ctx) {
        for _ in 0..6 {
            let batch = [rng.gen_range(1..3), rng.gen_range(1..4)];
            let d = (
                rng.gen_range(1..80),
                rng.gen_range(1..80),
                rng.gen_range(1..80),
                rng.gen_range(1..4),
                batch,
                rng.gen_range(1..4),
            );
            let beta = [0.0, 1.0, 0.3][rng.gen_range(0..3)];
            let alpha = rng.gen_range(-2.0..2.0);
            let (ta, tb) = (rng.gen(), rng.gen());
            let case = Case::packed(&mut rng, d, ta, tb, alpha, beta);
            case.check(&ctx, &gemm, &format!("random ta {ta} tb {tb}"), seed);
        }
    }
}

/// Training attention per (sequence, head) on token-major activations: Q, dO
/// `[n_seq*seq, n_head*hd]`, K, V `[n_seq*seq, n_kv*hd]`, P `[n_seq, n_head, seq, seq]`.
#[test]
fn gpu_gemm_attention_layouts() {
    let Some(ctx) = gpu_or_skip("gpu_gemm_attention_layouts") else {
        return;
    };
    let (seed, mut rng) = crate::testkit::seeded(module_path!());
    let (n_seq, seq, n_head, n_kv) = (2usize, rng.gen_range(1..40usize), 6usize, 3usize);
    let hd = rng.gen_range(1..40usize);
    let ratio = n_head / n_kv;
    let t = n_seq * seq;
    let (qw, kw) = ((n_head * hd) as u32, (n_kv * hd) as u32);
    let (seq32, hd32) = (seq as u32, hd as u32);
    let pp = seq32 * seq32; // one head's scores
    let base = |a, a_s, b, b_s, b_div, c_len, c_row, c_batch| Case {
        a,
        a_s,
        b,
        b_s,
        b_div,
        c: vec![f32::NAN; c_len],
        c_row,
        c_batch,
        m: seq,
        n: seq,
        k: hd,
        groups: 1,
        batch: [n_seq, n_head],
        alpha: 1.0,
        beta: 0.0,
    };
    let s = |row, col, batch, group| Strides {
        row,
        col,
        batch,
        group,
    };
    // S = Q·Kᵀ / √hd: query head h reads key head h / ratio.
    let mut scores = base(
        random(&mut rng, t * n_head * hd),
        s(qw, 1, [seq32 * qw, hd32], 0),
        random(&mut rng, t * n_kv * hd),
        s(1, kw, [seq32 * kw, hd32], 0),
        ratio as u32,
        n_seq * n_head * seq * seq,
        seq32,
        [n_head as u32 * pp, pp],
    );
    scores.alpha = 1.0 / (hd as f32).sqrt();
    // O = P·V.
    let mut out = base(
        random(&mut rng, n_seq * n_head * seq * seq),
        s(seq32, 1, [n_head as u32 * pp, pp], 0),
        random(&mut rng, t * n_kv * hd),
        s(kw, 1, [seq32 * kw, hd32], 0),
        ratio as u32,
        t * n_head * hd,
        qw,
        [seq32 * qw, hd32],
    );
    (out.n, out.k) = (hd, seq);
    // dV = Σ_{heads of the group} Pᵀ·dO: groups run over the query heads of a key head.
    let mut dv = base(
        random(&mut rng, n_seq * n_head * seq * seq),
        s(1, seq32, [n_head as u32 * pp, ratio as u32 * pp], pp),
        random(&mut rng, t * n_head * hd),
        s(qw, 1, [seq32 * qw, ratio as u32 * hd32], hd32),
        1,
        t * n_kv * hd,
        kw,
        [seq32 * kw, hd32],
    );
    (dv.n, dv.k, dv.groups, dv.batch) = (hd, seq, ratio, [n_seq, n_kv]);
    for gemm in variants(&ctx) {
        for (what, case) in [
            ("S = Q·Kᵀ", &scores),
            ("O = P·V", &out),
            ("dV = Pᵀ·dO", &dv),
        ] {
            case.check(&ctx, &gemm, what, seed);
        }
    }
}

#[test]
fn gemm_shape_errors_name_the_operand() {
    let Some(ctx) = gpu_or_skip("gemm_shape_errors_name_the_operand") else {
        return;
    };
    let buf =
        |name, floats: u64| Buffer::new(&ctx, name, 4 * floats, MemoryKind::DeviceLocal).unwrap();
    // A [4, 6] row-major, B = Wᵀ with W [5, 6], C [4, 5].
    let (a, b, c) = (buf("lhs", 24), buf("weight", 30), buf("out", 20));
    let (a, b, c) = (a.whole(), b.whole(), c.whole());
    let ok = GemmArgs {
        a: &a,
        a_s: Strides {
            row: 6,
            col: 1,
            ..Strides::default()
        },
        b: &b,
        b_s: Strides {
            row: 1,
            col: 6,
            ..Strides::default()
        },
        b_div: 1,
        c: &c,
        c_row: 5,
        c_batch: [0, 0],
        m: 4,
        n: 5,
        k: 6,
        groups: 1,
        batch: [1, 1],
        alpha: 1.0,
        beta: 0.0,
    };
    let gemm = Gemm::new(&ctx).unwrap();
    let mut chain = Chain::new(&ctx).unwrap();
    gemm.record(&mut chain, &ok).unwrap();
    let err = |args: GemmArgs| {
        gemm.record(&mut Chain::new(&ctx).unwrap(), &args)
            .unwrap_err()
            .to_string()
    };
    let e = err(GemmArgs { m: 5, ..ok });
    assert!(
        e.contains("gemm") && e.contains("a (lhs)") && e.contains("30 values"),
        "{e}"
    );
    let e = err(GemmArgs {
        n: 6,
        c_row: 6,
        ..ok
    });
    assert!(e.contains("b (weight)") && e.contains("36 values"), "{e}");
    let e = err(GemmArgs {
        batch: [1, 2],
        c_batch: [0, 20],
        ..ok
    });
    assert!(e.contains("c (out)") && e.contains("40 values"), "{e}");
    let e = err(GemmArgs { c_row: 6, ..ok });
    assert!(e.contains("c (out)") && e.contains("23 values"), "{e}");
    let e = err(GemmArgs { k: 0, ..ok });
    assert!(e.contains("k is 0"), "{e}");
    let e = err(GemmArgs {
        batch: [0, 1],
        ..ok
    });
    assert!(e.contains("batch[0] is 0"), "{e}");
    let e = err(GemmArgs { b_div: 0, ..ok });
    assert!(e.contains("b_div is 0"), "{e}");
    let e = err(GemmArgs {
        a_s: Strides {
            batch: [u32::MAX, 0],
            ..ok.a_s
        },
        batch: [3, 1],
        c_batch: [0, 0],
        ..ok
    });
    assert!(e.contains("32 bits"), "{e}");
}
