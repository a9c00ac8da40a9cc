//! IQ4_XS: 256 elements in 136 bytes `[d:2][scales_h:2][scales_l:4][qs:128]` — IQ4_NL's
//! non-linear code book with a 6-bit scale per 32-element sub-block instead of an f16 per block.
//!
//! Sub-block `j` (0..8) has scale `ls = (low nibble j % 2 of scales_l[j / 2]) | (bits 2j..2j+2 of
//! the little-endian u16 scales_h) << 4` and value `(d * (ls - 32)) * IQ4_NL_VALUES[q]`, the
//! product in that order as ggml's `dequantize_row_iq4_xs` and gguf-py form it. Its codes are
//! the 16 bytes `qs[16j..16j + 16]`, packed as in Q4_0 (element `l < 16` the low nibble of byte
//! `l`, element `l + 16` the high nibble).
//!
//! No quantizer: ggml's (`quantize_row_iq4_xs_ref`) searches scales against an importance
//! weighting and is not needed to run the type.

use super::legacy::IQ4_NL_VALUES;
use super::{f16_at, lanes_add_scaled, lanes_dot, BlockFormat, Lanes};
use crate::types::QK_K;

/// The 8 sub-block scales `d * (ls - 32)` of a block.
#[inline(always)]
fn sub_scales(b: &[u8]) -> [f32; 8] {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..8];
    let mut dl = [0f32; 8];
    for (j, dl) in dl.iter_mut().enumerate() {
        let low = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0F;
        let high = ((scales_h >> (2 * j)) & 3) as u8;
        *dl = d * ((low | (high << 4)) as i32 - 32) as f32;
    }
    dl
}

/// The code book values of sub-block `j`'s 32 elements.
#[inline(always)]
fn sub_values(b: &[u8], j: usize) -> [f32; 32] {
    let qs = &b[8 + 16 * j..8 + 16 * j + 16];
    let mut v = [0f32; 32];
    for l in 0..16 {
        v[l] = IQ4_NL_VALUES[(qs[l] & 0x0F) as usize] as f32;
        v[l + 16] = IQ4_NL_VALUES[(qs[l] >> 4) as usize] as f32;
    }
    v
}

#[allow(non_camel_case_types)]
pub(super) struct IQ4_XS;

impl BlockFormat for IQ4_XS {
    const ELEMS: usize = QK_K;
    const BYTES: usize = 136;
    fn dequantize(b: &[u8], out: &mut [f32]) {
        let b = &b[..Self::BYTES];
        for ((j, out), dl) in out[..QK_K]
            .chunks_exact_mut(32)
            .enumerate()
            .zip(sub_scales(b))
        {
            for (o, v) in out.iter_mut().zip(sub_values(b, j)) {
                *o = dl * v;
            }
        }
    }
    fn dot(b: &[u8], x: &[f32], acc: &mut Lanes) {
        let b = &b[..Self::BYTES];
        for ((j, x), dl) in x[..QK_K].chunks_exact(32).enumerate().zip(sub_scales(b)) {
            lanes_add_scaled(acc, dl, &lanes_dot(&sub_values(b, j), x));
        }
    }
}
