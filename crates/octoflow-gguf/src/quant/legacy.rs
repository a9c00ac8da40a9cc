//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 and IQ4_NL.
//!
//! Layouts (bytes; `d`, `m`, `s` are f16):
//! - Q4_0  `[d:2][qs:16]`: element `j < 16` is the low nibble of `qs[j]`, element `j + 16` the high
//!   nibble; value = `d * (q - 8)`.
//! - Q4_1  `[d:2][m:2][qs:16]`: nibbles as Q4_0; value = `d * q + m`.
//! - Q5_0  `[d:2][qh:4][qs:16]`: nibbles as Q4_0, bit `i` of the little-endian u32 `qh` is bit 4
//!   of element `i`; value = `d * (q - 16)`.
//! - Q5_1  `[d:2][m:2][qh:4][qs:16]`: as Q5_0; value = `d * q + m`.
//! - Q8_0  `[d:2][qs:32 × i8]`: value = `d * q`.
//! - Q8_1  `[d:2][s:2][qs:32 × i8]`: value = `d * q`; `s = d * sum(q)` (used by ggml's dot kernels).
//! - IQ4_NL `[d:2][qs:16]`: nibbles as Q4_0; value = `d * IQ4_NL_VALUES[q]`.
//!
//! The products are formed in the same order as ggml and gguf-py (`(d * q) + m`, no fused
//! multiply-add), which is what makes dequantization bit-exact with them.

use super::{
    f16_at, lanes_add_scaled, lanes_dot, lanes_sum, put_f16, BlockFormat, BlockQuantize, Lanes,
};

const QK: usize = 32;

/// The non-linear 4-bit code book of IQ4_NL (`kvalues_iq4nl` in ggml).
pub(super) const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Unpacks 16 bytes of nibble pairs into 32 codes (low nibbles first).
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; QK] {
    let qs = &qs[..16];
    let mut q = [0u8; QK];
    for j in 0..16 {
        q[j] = qs[j] & 0x0F;
        q[j + 16] = qs[j] >> 4;
    }
    q
}

/// Unpacks nibbles plus the fifth bits of `qh` (bit `i` for element `i`) into 32 codes.
#[inline(always)]
fn five_bit(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = nibbles(qs);
    for (i, v) in q.iter_mut().enumerate() {
        *v |= (((h >> i) & 1) as u8) << 4;
    }
    q
}

/// Packs 32 codes of up to 4 bits as [`nibbles`] reads them.
fn pack_nibbles(q: &[u8; QK], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
    }
}

/// Packs 32 five-bit codes as [`five_bit`] reads them.
fn pack_five_bit(q: &[u8; QK], qh: &mut [u8], qs: &mut [u8]) {
    pack_nibbles(q, qs);
    let h = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (i, &v)| h | (((v >> 4) & 1) as u32) << i);
    qh[..4].copy_from_slice(&h.to_le_bytes());
}

/// `acc += d * dot(q - offset, x)`: the dot of a symmetric block.
#[inline(always)]
fn dot_symmetric(d: f32, q: &[u8; QK], offset: i32, x: &[f32], acc: &mut Lanes) {
    let mut v = [0f32; QK];
    for (v, &q) in v.iter_mut().zip(q) {
        *v = (q as i32 - offset) as f32;
    }
    lanes_add_scaled(acc, d, &lanes_dot(&v, &x[..QK]));
}

/// `acc += d * dot(q, x) + m * sum(x)`: the dot of a block with an offset.
#[inline(always)]
fn dot_affine(d: f32, m: f32, q: &[u8; QK], x: &[f32], acc: &mut Lanes) {
    let mut v = [0f32; QK];
    for (v, &q) in v.iter_mut().zip(q) {
        *v = q as f32;
    }
    let x = &x[..QK];
    lanes_add_scaled(acc, d, &lanes_dot(&v, x));
    lanes_add_scaled(acc, m, &lanes_sum(x));
}

/// The value with the largest magnitude (the first one on ties), as ggml's symmetric quantizers
/// pick it; its sign sets the sign of the scale.
fn signed_absmax(values: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in values {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// The minimum and maximum of a block, starting from ±f32::MAX like ggml.
fn min_max(values: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in values {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Symmetric codes `min(top, trunc(v * id + bias))`, as `quantize_row_q{4,5}_0_ref`
/// (`bias` is the zero code plus one half, so that truncation rounds).
fn symmetric_codes(values: &[f32], id: f32, bias: f32, top: u8) -> [u8; QK] {
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(values) {
        *q = ((v * id + bias) as i8).min(top as i8) as u8;
    }
    q
}

/// Affine codes `min(top, trunc((v - min) * id + 0.5))`, as `quantize_row_q{4,5}_1_ref`.
fn affine_codes(values: &[f32], min: f32, id: f32, top: u8) -> [u8; QK] {
    let mut q = [0u8; QK];
    for (q, &v) in q.iter_mut().zip(values) {
        *q = (((v - min) * id + 0.5) as u8).min(top);
    }
    q
}

#[allow(non_camel_case_types)]
pub(super) struct Q4_0;

impl BlockFormat for Q4_0 {
    const ELEMS: usize = QK;
    const BYTES: usize = 18;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for (o, q) in out[..QK].iter_mut().zip(nibbles(&b[2..18])) {
            *o = d * (q as i32 - 8) as f32;
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_symmetric(f16_at(b, 0), &nibbles(&b[2..18]), 8, x, acc);
    }
}

impl BlockQuantize for Q4_0 {
    fn quantize(v: &[f32], b: &mut [u8]) {
        let d = signed_absmax(v) / -8.0;
        put_f16(b, 0, d);
        pack_nibbles(&symmetric_codes(v, inverse(d), 8.5, 15), &mut b[2..18]);
    }
}

#[allow(non_camel_case_types)]
pub(super) struct Q4_1;

impl BlockFormat for Q4_1 {
    const ELEMS: usize = QK;
    const BYTES: usize = 20;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (o, q) in out[..QK].iter_mut().zip(nibbles(&b[4..20])) {
            *o = d * q as f32 + m;
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_affine(f16_at(b, 0), f16_at(b, 2), &nibbles(&b[4..20]), x, acc);
    }
}

impl BlockQuantize for Q4_1 {
    fn quantize(v: &[f32], b: &mut [u8]) {
        let (min, max) = min_max(v);
        let d = (max - min) / 15.0;
        put_f16(b, 0, d);
        put_f16(b, 2, min);
        pack_nibbles(&affine_codes(v, min, inverse(d), 15), &mut b[4..20]);
    }
}

#[allow(non_camel_case_types)]
pub(super) struct Q5_0;

impl BlockFormat for Q5_0 {
    const ELEMS: usize = QK;
    const BYTES: usize = 22;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for (o, q) in out[..QK].iter_mut().zip(five_bit(&b[2..6], &b[6..22])) {
            *o = d * (q as i32 - 16) as f32;
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_symmetric(f16_at(b, 0), &five_bit(&b[2..6], &b[6..22]), 16, x, acc);
    }
}

impl BlockQuantize for Q5_0 {
    fn quantize(v: &[f32], b: &mut [u8]) {
        let d = signed_absmax(v) / -16.0;
        put_f16(b, 0, d);
        let q = symmetric_codes(v, inverse(d), 16.5, 31);
        let (qh, qs) = b[2..22].split_at_mut(4);
        pack_five_bit(&q, qh, qs);
    }
}

#[allow(non_camel_case_types)]
pub(super) struct Q5_1;

impl BlockFormat for Q5_1 {
    const ELEMS: usize = QK;
    const BYTES: usize = 24;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (o, q) in out[..QK].iter_mut().zip(five_bit(&b[4..8], &b[8..24])) {
            *o = d * q as f32 + m;
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        let q = five_bit(&b[4..8], &b[8..24]);
        dot_affine(f16_at(b, 0), f16_at(b, 2), &q, x, acc);
    }
}

impl BlockQuantize for Q5_1 {
    fn quantize(v: &[f32], b: &mut [u8]) {
        let (min, max) = min_max(v);
        let d = (max - min) / 31.0;
        put_f16(b, 0, d);
        put_f16(b, 2, min);
        let q = affine_codes(v, min, inverse(d), 31);
        let (qh, qs) = b[4..24].split_at_mut(4);
        pack_five_bit(&q, qh, qs);
    }
}

/// Dequantizes 32 signed bytes with scale `d`.
#[inline(always)]
fn dequantize_i8(d: f32, qs: &[u8], out: &mut [f32]) {
    for (o, &q) in out[..QK].iter_mut().zip(&qs[..QK]) {
        *o = q as i8 as f32 * d;
    }
}

#[inline(always)]
fn dot_i8(d: f32, qs: &[u8], x: &[f32], acc: &mut Lanes) {
    let mut v = [0f32; QK];
    for (v, &q) in v.iter_mut().zip(&qs[..QK]) {
        *v = q as i8 as f32;
    }
    lanes_add_scaled(acc, d, &lanes_dot(&v, &x[..QK]));
}

/// `quantize_row_q8_{0,1}_ref`: `d = absmax / 127`, `q = round(v / d)` (half away from zero).
/// Returns `d` and the sum of the codes.
fn quantize_i8(v: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let mut amax = 0f32;
    for &x in v {
        let a = x.abs();
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = inverse(d);
    let mut sum = 0i32;
    for (q, &x) in qs[..QK].iter_mut().zip(v) {
        let r = (x * id).round() as i8;
        sum += r as i32;
        *q = r as u8;
    }
    (d, sum)
}

#[allow(non_camel_case_types)]
pub(super) struct Q8_0;

impl BlockFormat for Q8_0 {
    const ELEMS: usize = QK;
    const BYTES: usize = 34;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        dequantize_i8(f16_at(b, 0), &b[2..34], out);
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_i8(f16_at(b, 0), &b[2..34], x, acc);
    }
}

impl BlockQuantize for Q8_0 {
    fn quantize(v: &[f32], b: &mut [u8]) {
        let (d, _) = quantize_i8(v, &mut b[2..34]);
        put_f16(b, 0, d);
    }
}

#[allow(non_camel_case_types)]
pub(super) struct Q8_1;

impl BlockFormat for Q8_1 {
    const ELEMS: usize = QK;
    const BYTES: usize = 36;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        dequantize_i8(f16_at(b, 0), &b[4..36], out);
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        dot_i8(f16_at(b, 0), &b[4..36], x, acc);
    }
}

impl BlockQuantize for Q8_1 {
    fn quantize(v: &[f32], b: &mut [u8]) {
        let (d, sum) = quantize_i8(v, &mut b[4..36]);
        put_f16(b, 0, d);
        put_f16(b, 2, sum as f32 * d);
    }
}

#[allow(non_camel_case_types)]
pub(super) struct IQ4_NL;

impl BlockFormat for IQ4_NL {
    const ELEMS: usize = QK;
    const BYTES: usize = 18;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let d = f16_at(b, 0);
        for (o, q) in out[..QK].iter_mut().zip(nibbles(&b[2..18])) {
            *o = d * IQ4_NL_VALUES[q as usize] as f32;
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        let mut v = [0f32; QK];
        for (v, q) in v.iter_mut().zip(nibbles(&b[2..18])) {
            *v = IQ4_NL_VALUES[q as usize] as f32;
        }
        lanes_add_scaled(acc, f16_at(b, 0), &lanes_dot(&v, &x[..QK]));
    }
}
