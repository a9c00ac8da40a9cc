//! The K-quant super-block formats (256 elements per block): layouts and dequantization.
//! Their reference quantizers are in `k_quantize.rs`.
//!
//! Layouts (bytes; `d`, `dmin` are f16 unless noted):
//! - Q2_K `[scales:16][qs:64][d:2][dmin:2]`: 16 sub-blocks of 16; `scales[s]` holds a 4-bit scale
//!   (low nibble) and a 4-bit min (high nibble); value = `d*sc * q - dmin*m` with 2-bit `q`.
//! - Q3_K `[hmask:32][qs:64][scales:12][d:2]`: 16 sub-blocks of 16 with 6-bit signed scales
//!   (offset 32); 3-bit `q` = 2 low bits from `qs` + a high bit from `hmask` (a set bit means
//!   no `-4`); value = `d*(sc - 32) * q`.
//! - Q4_K `[d:2][dmin:2][scales:12][qs:128]`: 8 sub-blocks of 32 with 6-bit scales and mins
//!   packed in 12 bytes ([`scale_min_k4`]); value = `d*sc * q - dmin*m` with 4-bit `q`.
//! - Q5_K `[d:2][dmin:2][scales:12][qh:32][qs:128]`: as Q4_K with a fifth bit from `qh`.
//! - Q6_K `[ql:128][qh:64][scales:16 × i8][d:2]`: 16 sub-blocks of 16; 6-bit `q` = 4 bits from
//!   `ql` + 2 bits from `qh`; value = `d*sc * (q - 32)`.
//! - Q8_K `[d:4 f32][qs:256 × i8][bsums:16 × i16]`: value = `d * q`; `bsums` are sums of 16
//!   codes (for dot kernels), ignored when dequantizing.
//!
//! The 2-bit planes (Q2_K/Q3_K `qs`, Q6_K `qh`) hold elements `32*j + l` of each 128-element
//! half at bits `2*j` of byte `l`; nibble planes hold element `l` of each 64-element chunk in
//! the low nibble of byte `l` and element `32 + l` in the high nibble. The scale is multiplied
//! in first and the min subtracted last, as ggml and gguf-py do, so results are bit-exact.

use super::{f16_at, lanes_add_scaled, lanes_dot, BlockFormat, Lanes};
use crate::types::QK_K;

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K:
/// bytes 0..4 hold scales 0..4 (and the top 2 bits of scales 4..8), bytes 4..8 mins 0..4 (and
/// the top bits of mins 4..8), bytes 8..12 the low nibbles of scales/mins 4..8.
#[inline(always)]
pub(super) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The 16 signed 6-bit scales of Q3_K (offset 32 already removed).
#[inline(always)]
pub(super) fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    let s = &s[..12];
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0x0F } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Dequantizes into a stack buffer and adds its dot with `x` into `acc`.
#[inline(always)]
fn dot_via_buffer<F: BlockFormat>(b: &[u8], x: &[f32], acc: &mut Lanes) {
    let mut buf = [0f32; QK_K];
    F::dequantize(b, &mut buf);
    lanes_add_scaled(acc, 1.0, &lanes_dot(&buf, &x[..QK_K]));
}

#[allow(non_camel_case_types)]
pub(super) struct Q2_K;

impl BlockFormat for Q2_K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 84;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let (scales, qs) = (&b[0..16], &b[16..80]);
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        for (s, out) in out[..QK_K].chunks_exact_mut(16).enumerate() {
            let dl = d * (scales[s] & 0x0F) as f32;
            let ml = dmin * (scales[s] >> 4) as f32;
            let start = 32 * (s / 8) + 16 * (s % 2);
            let q = &qs[start..start + 16];
            let shift = 2 * ((s % 8) / 2);
            for (o, &q) in out.iter_mut().zip(q) {
                *o = dl * ((q >> shift) & 3) as f32 - ml;
            }
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_via_buffer::<Self>(b, x, acc);
    }
}

#[allow(non_camel_case_types)]
pub(super) struct Q3_K;

impl BlockFormat for Q3_K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 110;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let (hmask, qs) = (&b[0..32], &b[32..96]);
        let scales = q3_k_scales(&b[96..108]);
        let d = f16_at(b, 108);
        for (s, out) in out[..QK_K].chunks_exact_mut(16).enumerate() {
            let dl = d * scales[s] as f32;
            let start = 32 * (s / 8) + 16 * (s % 2);
            let q = &qs[start..start + 16];
            let hm = &hmask[16 * (s % 2)..16 * (s % 2) + 16];
            let shift = 2 * ((s % 8) / 2);
            let bit = s / 2;
            for ((o, &q), &h) in out.iter_mut().zip(q).zip(hm) {
                let low = ((q >> shift) & 3) as i32;
                let minus = if (h >> bit) & 1 == 0 { 4 } else { 0 };
                *o = dl * (low - minus) as f32;
            }
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_via_buffer::<Self>(b, x, acc);
    }
}

/// Q4_K and Q5_K share everything but the fifth bit; `qh` is `None` for Q4_K.
#[inline(always)]
fn dequantize_q45_k(b: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    for (s, out) in out[..QK_K].chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(s, scales);
        let (d1, m1) = (d * sc as f32, dmin * m as f32);
        let q = &qs[32 * (s / 2)..32 * (s / 2) + 32];
        let shift = 4 * (s % 2);
        match qh {
            None => {
                for (o, &q) in out.iter_mut().zip(q) {
                    *o = d1 * ((q >> shift) & 0x0F) as f32 - m1;
                }
            }
            Some(qh) => {
                for ((o, &q), &h) in out.iter_mut().zip(q).zip(&qh[..32]) {
                    let v = ((q >> shift) & 0x0F) | (((h >> s) & 1) << 4);
                    *o = d1 * v as f32 - m1;
                }
            }
        }
    }
}

#[allow(non_camel_case_types)]
pub(super) struct Q4_K;

impl BlockFormat for Q4_K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 144;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        dequantize_q45_k(b, None, &b[16..144], out);
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_via_buffer::<Self>(b, x, acc);
    }
}

#[allow(non_camel_case_types)]
pub(super) struct Q5_K;

impl BlockFormat for Q5_K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 176;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        dequantize_q45_k(b, Some(&b[16..48]), &b[48..176], out);
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_via_buffer::<Self>(b, x, acc);
    }
}

#[allow(non_camel_case_types)]
pub(super) struct Q6_K;

impl BlockFormat for Q6_K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 210;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
        let d = f16_at(b, 208);
        for (s, out) in out[..QK_K].chunks_exact_mut(16).enumerate() {
            let dl = d * scales[s] as i8 as f32;
            // Sub-block s is rows 16*(s%2).. of quarter k = (s%8)/2 of half n = s/8.
            let (n, k, l0) = (s / 8, (s % 8) / 2, 16 * (s % 2));
            let lo_start = 64 * n + 32 * (k % 2) + l0;
            let lo = &ql[lo_start..lo_start + 16];
            let hi = &qh[32 * n + l0..32 * n + l0 + 16];
            let (lo_shift, hi_shift) = (4 * (k / 2), 2 * k);
            for ((o, &l), &h) in out.iter_mut().zip(lo).zip(hi) {
                let q = ((l >> lo_shift) & 0x0F) | (((h >> hi_shift) & 3) << 4);
                *o = dl * (q as i32 - 32) as f32;
            }
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_via_buffer::<Self>(b, x, acc);
    }
}

#[allow(non_camel_case_types)]
pub(super) struct Q8_K;

impl BlockFormat for Q8_K {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 292;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (o, &q) in out[..QK_K].iter_mut().zip(&b[4..260]) {
            *o = d * q as i8 as f32;
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        let mut v = [0f32; QK_K];
        for (v, &q) in v.iter_mut().zip(&b[4..260]) {
            *v = q as i8 as f32;
        }
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        lanes_add_scaled(acc, d, &lanes_dot(&v, &x[..QK_K]));
    }
}
