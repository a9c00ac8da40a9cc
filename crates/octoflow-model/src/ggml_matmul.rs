//! `y = W x` the way llama.cpp's CPU backend computes it (`Numerics::Ggml`): each activation
//! row is quantized to the weight type's `vec_dot_type`, then dotted with the weight rows by
//! integer block products scaled in f32 (`ggml_vec_dot_<w>_<act>` in ggml-cpu).
//!
//! Per weight block (codes `q`, activation codes `a`, integer sums exact):
//! - Q4_0, Q5_0, Q8_0 with Q8_0: `(d_w * d_a) * sum(q * a)`, `q` centred (`q - 8`, `q - 16`).
//! - Q4_1, Q5_1 with Q8_1: `(d_w * d_a) * sum(q * a) + m_w * s_a`, where `s_a` is the
//!   activation block's f16 `d_a * sum(a)`: the offset term uses this rounded sum, not the
//!   codes themselves.
//! - Q4_K, Q5_K (8 sub-blocks of 32) and Q6_K (16 of 16) with Q8_K:
//!   `(d_a * d_w) * sum_s(sc_s * sum(q * a)) - (d_a * dmin_w) * sum_s(m_s * bsum_s)`, with the
//!   6-bit sub-block scales `sc` and mins `m` as integers and `bsum_s` the activation's code
//!   sums over the sub-block (Q6_K: codes `q - 32`, no min).
//!
//! Block results are summed in f32 in row order; ggml's SIMD kernels sum in lanes, which
//! differs by float rounding only (~1e-6 relative). Weight types without an integer kernel
//! here (F32, F16, BF16, Q2_K, Q3_K, IQ4_NL, MXFP4) take the exact path on activations
//! rounded to their `vec_dot_type` and back, which is the same product up to that rounding.

use rayon::prelude::*;

use octoflow_gguf::quant;
use octoflow_gguf::GgmlType;

use crate::error::Result;
use crate::matmul::{matmul, GEMM_MIN_TOKENS};
use crate::weights::QMatrix;

/// Weight rows per rayon task on the few-token path.
const ROWS_PER_TASK: usize = 16;
/// Elements per legacy block (and per Q8_0/Q8_1 activation block).
const QK: usize = 32;
/// Elements per K-quant super-block (and per Q8_K activation block).
const QK_K: usize = 256;

/// The type llama.cpp converts activations to before multiplying with weights of type `ty`
/// (`type_traits_cpu[ty].vec_dot_type`).
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::MXFP4 => T::Q8_0,
        T::Q4_1 | T::Q5_1 | T::Q8_1 => T::Q8_1,
        T::Q2_K | T::Q3_K | T::Q4_K | T::Q5_K | T::Q6_K | T::Q8_K => T::Q8_K,
        T::F16 => T::F16,
        T::BF16 => T::BF16,
        _ => T::F32,
    }
}

/// How a weight format's integer dot is scaled (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `(d_w d_a) sum(q a)` per 32-block.
    Symmetric,
    /// `(d_w d_a) sum(q a) + m_w s_a` per 32-block.
    Affine,
    /// Super-blocks of 256 with `sub`-element sub-blocks, integer scales and (if `mins`)
    /// integer mins.
    K { sub: usize, mins: bool },
}

pub(crate) fn kind(ty: GgmlType) -> Option<Kind> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 => Kind::Symmetric,
        T::Q4_1 | T::Q5_1 => Kind::Affine,
        T::Q4_K | T::Q5_K => Kind::K {
            sub: 32,
            mins: true,
        },
        T::Q6_K => Kind::K {
            sub: 16,
            mins: false,
        },
        _ => return None,
    })
}

/// `out[t, r] = dot(w row r, x[t])` with llama.cpp's CPU roundings.
///
/// `x` is `[n_tokens, w.n_cols]` and `out` is `[n_tokens, w.n_rows]`, both f32 row-major.
///
/// Like [`matmul`], two paths with the same result up to f32 summation order:
/// - a few tokens: the integer block dots of [`IntRow::dot`], row by row;
/// - many tokens: the activations are rounded to their `vec_dot_type` and back, and go through
///   the exact path's GEMM over dequantized weights. In exact arithmetic this is the integer
///   dot: each block's `sum((d_w q) (d_a a))` is `d_w d_a sum(q a)`, and K-quant mins times the
///   dequantized activations sum to the `bsums` term. The one exception is the Q8_1 offset term
///   `m_w * s_a`, which uses the f16-rounded `s_a`; the GEMM computes `m_w * d_a * sum(a)`, so
///   the difference `m_w * (s_a - d_a sum(a))` is added per block afterwards.
pub fn matmul_ggml(w: &QMatrix, x: &[f32], out: &mut [f32]) -> Result<()> {
    let n_tokens = x.len() / w.n_cols;
    match kind(w.ty) {
        Some(k) if n_tokens < GEMM_MIN_TOKENS => matmul_int(w, k, x, out),
        k => {
            let mut xr = x.to_vec();
            round_to_vec_dot_type(w.ty, &mut xr).map_err(|e| w.quant_error(e))?;
            matmul(w, &xr, out)?;
            if k == Some(Kind::Affine) {
                add_q8_1_sum_rounding(w, x, out)?;
            }
            Ok(())
        }
    }
}

/// The few-token path: unpack each weight row once, then integer block dots with each token.
fn matmul_int(w: &QMatrix, k: Kind, x: &[f32], out: &mut [f32]) -> Result<()> {
    let n_tokens = x.len() / w.n_cols;
    let acts = x
        .chunks_exact(w.n_cols)
        .map(|xt| ActRow::quantize(vec_dot_type(w.ty), xt))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| w.quant_error(e))?;
    let mut out_t = vec![0f32; w.n_rows * n_tokens];
    out_t
        .par_chunks_mut(ROWS_PER_TASK * n_tokens)
        .enumerate()
        .for_each(|(chunk, o)| {
            let mut row = IntRow::default();
            for (i, col) in o.chunks_exact_mut(n_tokens).enumerate() {
                row.unpack(w.ty, w.row(chunk * ROWS_PER_TASK + i));
                for (v, a) in col.iter_mut().zip(&acts) {
                    *v = row.dot(k, a);
                }
            }
        });
    for (r, col) in out_t.chunks_exact(n_tokens).enumerate() {
        for (t, &v) in col.iter().enumerate() {
            out[t * w.n_rows + r] = v;
        }
    }
    Ok(())
}

/// For Q4_1/Q5_1 weights (bytes 2..4 of each block: the f16 offset `m`) after a GEMM over
/// dequantized Q8_1 activations: adds `sum_b m[r, b] * (s[t, b] - d[t, b] * sum(a[t, b]))`,
/// turning each block's `m * d * sum(a)` into ggml's `m * s`.
fn add_q8_1_sum_rounding(w: &QMatrix, x: &[f32], out: &mut [f32]) -> Result<()> {
    let n_blocks = w.n_cols / QK;
    let mut corr = Vec::with_capacity(x.len() / QK);
    for xt in x.chunks_exact(w.n_cols) {
        let a = ActRow::quantize(GgmlType::Q8_1, xt).map_err(|e| w.quant_error(e))?;
        for (b, q) in a.qs.chunks_exact(QK).enumerate() {
            let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
            corr.push(a.s[b] - a.d[b] * sum as f32);
        }
    }
    let bytes = w.ty.type_size();
    let m: Vec<f32> = (0..w.n_rows)
        .flat_map(|r| (0..n_blocks).map(move |b| f16_at(w.row(r), b * bytes + 2)))
        .collect();
    out.par_chunks_mut(w.n_rows)
        .zip(corr.par_chunks(n_blocks))
        .for_each(|(o, c)| {
            for (v, mr) in o.iter_mut().zip(m.chunks_exact(n_blocks)) {
                *v += mr.iter().zip(c).map(|(m, c)| m * c).sum::<f32>();
            }
        });
    Ok(())
}

/// Rounds `x` (whole rows of a matrix of type `ty`) to what `ty`'s `vec_dot_type` can hold:
/// quantize and dequantize, or round to f16/bf16.
pub fn round_to_vec_dot_type(
    ty: GgmlType,
    x: &mut [f32],
) -> std::result::Result<(), quant::QuantError> {
    let act = vec_dot_type(ty);
    if act == GgmlType::F32 {
        return Ok(());
    }
    let mut q = vec![0u8; quant::quantized_size(act, x.len())?];
    quant::quantize(act, x, &mut q)?;
    quant::dequantize(act, &q, x)
}

/// One activation row in its `vec_dot_type` (Q8_0, Q8_1 or Q8_K), unpacked.
#[derive(Debug, Clone, Default)]
pub(crate) struct ActRow {
    /// The codes, `[n]`.
    pub(crate) qs: Vec<i8>,
    /// The scale of each block (Q8_0/Q8_1: the stored f16; Q8_K: the stored f32).
    pub(crate) d: Vec<f32>,
    /// Q8_1 only: each block's stored f16 `d * sum(codes)`.
    pub(crate) s: Vec<f32>,
    /// Q8_K only: sums of each 16 consecutive codes.
    pub(crate) bsums: Vec<i32>,
}

impl ActRow {
    /// Quantizes `x` with ggml's reference quantizer for `ty` (Q8_0, Q8_1 or Q8_K).
    pub(crate) fn quantize(
        ty: GgmlType,
        x: &[f32],
    ) -> std::result::Result<Self, quant::QuantError> {
        let mut bytes = vec![0u8; quant::quantized_size(ty, x.len())?];
        quant::quantize(ty, x, &mut bytes)?;
        let mut a = ActRow {
            qs: Vec::with_capacity(x.len()),
            ..Default::default()
        };
        let i8s = |b: &[u8]| b.iter().map(|&v| v as i8).collect::<Vec<_>>();
        match ty {
            GgmlType::Q8_0 => {
                for b in bytes.chunks_exact(2 + QK) {
                    a.d.push(f16_at(b, 0));
                    a.qs.extend(i8s(&b[2..]));
                }
            }
            GgmlType::Q8_1 => {
                for b in bytes.chunks_exact(4 + QK) {
                    a.d.push(f16_at(b, 0));
                    a.s.push(f16_at(b, 2));
                    a.qs.extend(i8s(&b[4..]));
                }
            }
            _ => {
                // Q8_K: [d: f32][qs: 256 × i8][bsums: 16 × i16]
                for b in bytes.chunks_exact(4 + QK_K + 32) {
                    a.d.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    a.qs.extend(i8s(&b[4..4 + QK_K]));
                    let sums = b[4 + QK_K..].chunks_exact(2);
                    a.bsums
                        .extend(sums.map(|s| i32::from(i16::from_le_bytes([s[0], s[1]]))));
                }
            }
        }
        Ok(a)
    }

    /// The values the codes stand for: `d * q` per element.
    #[cfg(test)]
    pub(crate) fn dequantize(&self) -> Vec<f32> {
        let bs = self.qs.len() / self.d.len();
        self.qs
            .iter()
            .enumerate()
            .map(|(i, &q)| self.d[i / bs] * f32::from(q))
            .collect()
    }
}

/// One weight row unpacked to integers, as ggml's dot kernels use it.
#[derive(Debug, Clone, Default)]
pub(crate) struct IntRow {
    /// Element codes, centred for the symmetric formats (`q - 8`, `q - 16`, `q - 32`).
    pub(crate) codes: Vec<i8>,
    /// Per block: the f16 scale `d`.
    pub(crate) d: Vec<f32>,
    /// Per block: the f16 offset `m` (Q4_1, Q5_1) or `dmin` (Q4_K, Q5_K); else 0.
    pub(crate) m: Vec<f32>,
    /// Per K sub-block: the integer scale.
    pub(crate) sc: Vec<i32>,
    /// Per K sub-block: the integer min (Q4_K, Q5_K).
    pub(crate) mins: Vec<i32>,
}

impl IntRow {
    /// Unpacks `row` (whole blocks of `ty`, one of the types with an integer kernel).
    pub(crate) fn unpack(&mut self, ty: GgmlType, row: &[u8]) {
        self.codes.clear();
        self.d.clear();
        self.m.clear();
        self.sc.clear();
        self.mins.clear();
        let bytes = ty.type_size();
        for b in row.chunks_exact(bytes) {
            match ty {
                GgmlType::Q4_0 => self.legacy(f16_at(b, 0), 0.0, &nibbles(&b[2..18]), 8),
                GgmlType::Q4_1 => self.legacy(f16_at(b, 0), f16_at(b, 2), &nibbles(&b[4..20]), 0),
                GgmlType::Q5_0 => {
                    self.legacy(f16_at(b, 0), 0.0, &five_bit(&b[2..6], &b[6..22]), 16)
                }
                GgmlType::Q5_1 => self.legacy(
                    f16_at(b, 0),
                    f16_at(b, 2),
                    &five_bit(&b[4..8], &b[8..24]),
                    0,
                ),
                GgmlType::Q8_0 => {
                    self.d.push(f16_at(b, 0));
                    self.m.push(0.0);
                    self.codes.extend(b[2..34].iter().map(|&v| v as i8));
                }
                GgmlType::Q4_K => self.q45_k(b, None, &b[16..144]),
                GgmlType::Q5_K => self.q45_k(b, Some(&b[16..48]), &b[48..176]),
                GgmlType::Q6_K => self.q6_k(b),
                _ => {}
            }
        }
    }

    fn legacy(&mut self, d: f32, m: f32, q: &[u8; QK], offset: i32) {
        self.d.push(d);
        self.m.push(m);
        self.codes
            .extend(q.iter().map(|&v| (i32::from(v) - offset) as i8));
    }

    /// Q4_K `[d][dmin][scales:12][qs:128]`, Q5_K with `qh:32` before `qs`: chunk `c` of 64
    /// elements is the low nibbles (sub-block `2c`) then the high nibbles (`2c + 1`) of
    /// `qs[32c..32c + 32]`; Q5_K's fifth bits are bits `2c` and `2c + 1` of `qh[l]`.
    fn q45_k(&mut self, b: &[u8], qh: Option<&[u8]>, qs: &[u8]) {
        self.d.push(f16_at(b, 0));
        self.m.push(f16_at(b, 2));
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, &b[4..16]);
            self.sc.push(i32::from(sc));
            self.mins.push(i32::from(m));
        }
        for c in 0..4 {
            let q = &qs[32 * c..32 * c + 32];
            for half in 0..2 {
                let bit = 2 * c + half;
                for (l, &v) in q.iter().enumerate() {
                    let low = if half == 0 { v & 0xF } else { v >> 4 };
                    let high = qh.map_or(0, |h| ((h[l] >> bit) & 1) << 4);
                    self.codes.push((low | high) as i8);
                }
            }
        }
    }

    /// Q6_K `[ql:128][qh:64][scales:16 × i8][d]`: in half `n`, element `32j + l` takes nibble
    /// `j / 2` of `ql[64n + l + 32 (j % 2)]` and bits `2j..2j+2` of `qh[32n + l]`; code - 32.
    fn q6_k(&mut self, b: &[u8]) {
        self.d.push(f16_at(b, 208));
        self.m.push(0.0);
        self.sc
            .extend(b[192..208].iter().map(|&s| i32::from(s as i8)));
        for n in 0..2 {
            let (ql, qh) = (&b[64 * n..64 * n + 64], &b[128 + 32 * n..160 + 32 * n]);
            for j in 0..4 {
                for l in 0..32 {
                    let byte = ql[l + 32 * (j % 2)];
                    let low = if j < 2 { byte & 0xF } else { byte >> 4 };
                    let q = low | (((qh[l] >> (2 * j)) & 3) << 4);
                    self.codes.push((i32::from(q) - 32) as i8);
                }
            }
        }
    }

    /// The dot of this row with an activation row of the matching `vec_dot_type`.
    pub(crate) fn dot(&self, k: Kind, a: &ActRow) -> f32 {
        let mut sum = 0f32;
        match k {
            Kind::Symmetric | Kind::Affine => {
                for (b, (q, qa)) in self
                    .codes
                    .chunks_exact(QK)
                    .zip(a.qs.chunks_exact(QK))
                    .enumerate()
                {
                    sum += (self.d[b] * a.d[b]) * idot(q, qa) as f32;
                    if k == Kind::Affine {
                        sum += self.m[b] * a.s[b];
                    }
                }
            }
            Kind::K { sub, mins } => {
                let n_sub = QK_K / sub;
                for (b, (q, qa)) in self
                    .codes
                    .chunks_exact(QK_K)
                    .zip(a.qs.chunks_exact(QK_K))
                    .enumerate()
                {
                    let sc = &self.sc[b * n_sub..][..n_sub];
                    let isum: i32 = q
                        .chunks_exact(sub)
                        .zip(qa.chunks_exact(sub))
                        .zip(sc)
                        .map(|((q, qa), &s)| s * idot(q, qa))
                        .sum();
                    sum += (a.d[b] * self.d[b]) * isum as f32;
                    if mins {
                        let per = sub / 16;
                        let bsums = &a.bsums[b * 16..][..16];
                        let summs: i32 = self.mins[b * n_sub..][..n_sub]
                            .iter()
                            .zip(bsums.chunks_exact(per))
                            .map(|(&m, s)| m * s.iter().sum::<i32>())
                            .sum();
                        sum -= (a.d[b] * self.m[b]) * summs as f32;
                    }
                }
            }
        }
        sum
    }
}

/// `sum(a[i] * b[i])` over signed bytes, exact in i32.
#[inline]
fn idot(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(i16::from(x) * i16::from(y)))
        .sum()
}

/// The 6-bit scale and min of sub-block `j` of Q4_K/Q5_K from the 12 packed bytes
/// (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// 16 bytes of nibble pairs to 32 codes: element `j` is the low nibble of byte `j`, element
/// `j + 16` its high nibble.
fn nibbles(qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for (j, &v) in qs.iter().enumerate() {
        q[j] = v & 0xF;
        q[j + 16] = v >> 4;
    }
    q
}

/// Nibbles plus fifth bits: bit `i` of the little-endian u32 `qh` is bit 4 of element `i`.
fn five_bit(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = nibbles(qs);
    for (i, v) in q.iter_mut().enumerate() {
        *v |= (((h >> i) & 1) as u8) << 4;
    }
    q
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

#[cfg(test)]
#[path = "ggml_matmul_tests.rs"]
mod tests;
