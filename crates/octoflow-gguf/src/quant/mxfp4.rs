//! MXFP4 (OCP microscaling FP4, as used by GPT-OSS): 32 elements in 17 bytes `[e:1][qs:16]`.
//!
//! `e` is an E8M0 power-of-two scale; each element is a 4-bit E2M1 code, packed as in Q4_0 (low
//! nibbles are elements 0..16, high nibbles 16..32). ggml stores the E2M1 values doubled
//! ([`E2M1_DOUBLED`]) and halves the scale instead, so value = `E2M1_DOUBLED[q] * 2^(e - 128)`.

use super::{lanes_add_scaled, lanes_dot, BlockFormat, BlockQuantize, Lanes};

const QK: usize = 32;

/// E2M1 code → value × 2 (`kvalues_mxfp4` in ggml); code 8 is negative zero.
const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e - 128)`, i.e. half the E8M0 scale `2^(e - 127)`; `e` 0 and 1 give f32 subnormals.
fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e as u32) - 1) << 23)
    }
}

fn decode(b: &[u8]) -> (f32, [f32; QK]) {
    let qs = &b[1..17];
    let mut v = [0f32; QK];
    for j in 0..16 {
        v[j] = E2M1_DOUBLED[(qs[j] & 0x0F) as usize] as f32;
        v[j + 16] = E2M1_DOUBLED[(qs[j] >> 4) as usize] as f32;
    }
    (e8m0_half(b[0]), v)
}

/// The code whose value is nearest to `x` at scale `d` (the first one on ties), as ggml's
/// `best_index_mxfp4`.
fn nearest_code(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (E2M1_DOUBLED[0] as f32 * d - x).abs();
    for (i, &k) in E2M1_DOUBLED.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

#[allow(non_camel_case_types)]
pub(super) struct MXFP4;

impl BlockFormat for MXFP4 {
    const ELEMS: usize = QK;
    const BYTES: usize = 17;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let (d, v) = decode(b);
        for (o, v) in out[..QK].iter_mut().zip(v) {
            *o = v * d;
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        let (d, v) = decode(b);
        lanes_add_scaled(acc, d, &lanes_dot(&v, &x[..QK]));
    }
}

impl BlockQuantize for MXFP4 {
    /// `quantize_row_mxfp4_ref`: the shared exponent is `floor(log2(absmax)) - 2` (so that the
    /// largest magnitude lands in E2M1's top binade), then each element takes its nearest code.
    fn quantize(v: &[f32], b: &mut [u8]) {
        let mut amax = 0f32;
        for &x in v {
            if amax < x.abs() {
                amax = x.abs();
            }
        }
        // log2 is rounded to f32 before the floor, exactly as in ggml: just below a large power
        // of two it rounds up to the power, and the reference quantizer takes the larger exponent.
        // Out-of-range exponents (absmax below 2^-125) wrap as the C cast does on x86.
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
        } else {
            0
        };
        b[0] = e;
        let d = e8m0_half(e);
        for j in 0..16 {
            b[1 + j] = nearest_code(v[j], d) | (nearest_code(v[j + 16], d) << 4);
        }
    }
}
