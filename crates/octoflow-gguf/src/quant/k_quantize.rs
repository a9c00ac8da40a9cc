//! ggml's reference K-quant quantizers (`quantize_row_q{2..8}_K_ref`), reimplemented for the
//! layouts documented in `k_dequant.rs`. Each first fits a scale (and min) per sub-block, then
//! quantizes those to 4 or 6 bits against a per-block f16 scale, and finally recomputes the
//! element codes against the scales as a decoder will see them.

use super::k_dequant::{q3_k_scales, scale_min_k4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K};
use super::k_search::{
    make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int, Qkx2, GROUP_MAX_EPS,
};
use super::{put_f16, BlockQuantize};
use crate::types::QK_K;

/// Packs 256 two-bit codes into 64 bytes: element `32*j + l` of each 128-element half goes to
/// bits `2*j` of byte `l` of that half's 32 bytes.
fn pack_2bit(codes: &[u8; QK_K], qs: &mut [u8]) {
    for (half, qs) in codes.chunks_exact(128).zip(qs[..64].chunks_exact_mut(32)) {
        for l in 0..32 {
            qs[l] = half[l] | (half[l + 32] << 2) | (half[l + 64] << 4) | (half[l + 96] << 6);
        }
    }
}

/// Requantizes sub-block `x` against its final step `d` and offset `dm`:
/// `clamp(round((x + dm) / d), lo, hi) - lo` (`lo` ≤ 0 maps the codes to unsigned).
/// Leaves `codes` as they are when `d` is 0, as ggml does.
fn requantize(x: &[f32], d: f32, dm: f32, lo: i32, hi: i32, codes: &mut [u8]) {
    if d == 0.0 {
        return;
    }
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = (nearest_int((v + dm) / d).clamp(lo, hi) - lo) as u8;
    }
}

impl BlockQuantize for Q2_K {
    fn quantize(x: &[f32], b: &mut [u8]) {
        const FIT: Qkx2 = Qkx2 {
            nmax: 3,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: true,
        };
        let mut codes = [0u8; QK_K];
        let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
        for (j, (x, c)) in x
            .chunks_exact(16)
            .zip(codes.chunks_exact_mut(16))
            .enumerate()
        {
            let mut w = [0f32; 16];
            for (w, v) in w.iter_mut().zip(x) {
                *w = v.abs();
            }
            (scales[j], mins[j]) = make_qkx2_quants(&FIT, x, &w, c);
        }
        let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
        let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });

        let sb = &mut b[0..16];
        sb.fill(0);
        let mut d = 0f32;
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for (s, &scale) in sb.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * scale) as u8;
            }
            d = max_scale / 15.0;
        }
        let mut dmin = 0f32;
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for (s, &min) in sb.iter_mut().zip(&mins) {
                *s |= (nearest_int(iscale * min) << 4) as u8;
            }
            dmin = max_min / 15.0;
        }
        let d = put_f16(b, 80, d);
        let dmin = put_f16(b, 82, dmin);
        for j in 0..16 {
            let sc = b[j];
            let dl = d * (sc & 0x0F) as f32;
            let ml = dmin * (sc >> 4) as f32;
            requantize(
                &x[16 * j..16 * j + 16],
                dl,
                ml,
                0,
                3,
                &mut codes[16 * j..16 * j + 16],
            );
        }
        pack_2bit(&codes, &mut b[16..80]);
    }
}

impl BlockQuantize for Q3_K {
    fn quantize(x: &[f32], b: &mut [u8]) {
        let mut codes = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0f32, 0f32);
        for (j, (x, c)) in x
            .chunks_exact(16)
            .zip(codes.chunks_exact_mut(16))
            .enumerate()
        {
            scales[j] = make_q3_quants(4, x, c);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }

        let sb = &mut b[96..108];
        sb.fill(0);
        let mut d = 0f32;
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &scale) in scales.iter().enumerate() {
                let l = ((nearest_int(iscale * scale) as i8 as i32).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    sb[j] = l & 0x0F;
                } else {
                    sb[j - 8] |= (l & 0x0F) << 4;
                }
                sb[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
            }
            d = 1.0 / iscale;
        }
        let d = put_f16(b, 108, d);
        let sc = q3_k_scales(&b[96..108]);

        let mut l = [0u8; QK_K];
        for (l, &c) in l.iter_mut().zip(&codes) {
            *l = c as u8;
        }
        for j in 0..16 {
            let dl = d * sc[j] as f32;
            requantize(
                &x[16 * j..16 * j + 16],
                dl,
                0.0,
                -4,
                3,
                &mut l[16 * j..16 * j + 16],
            );
        }
        // The high bit of element j goes to bit j/32 of hmask[j % 32].
        let hmask = &mut b[0..32];
        hmask.fill(0);
        for (j, l) in l.iter_mut().enumerate() {
            if *l > 3 {
                hmask[j % 32] |= 1 << (j / 32);
                *l -= 4;
            }
        }
        pack_2bit(&l, &mut b[32..96]);
    }
}

/// The shared first half of the Q4_K/Q5_K quantizers: fits 8 sub-blocks of 32 with
/// [`make_qkx2_quants`] (weights `rms + |x|`), packs the 6-bit scales and mins into
/// `b[4..16]`, writes `d`/`dmin` and returns the final codes in `0..=fit.nmax`.
fn quantize_q45_k(fit: &Qkx2, x: &[f32], b: &mut [u8]) -> [u8; QK_K] {
    let mut codes = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    for (j, (x, c)) in x
        .chunks_exact(32)
        .zip(codes.chunks_exact_mut(32))
        .enumerate()
    {
        let mut sum_x2 = 0f32;
        for &v in x {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut w = [0f32; 32];
        for (w, v) in w.iter_mut().zip(x) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(fit, x, &w, c);
    }
    let max_scale = scales.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let max_min = mins.iter().fold(0f32, |m, &s| if s > m { s } else { m });
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };

    let sb = &mut b[4..16];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sb[j] = ls;
            sb[j + 4] = lm;
        } else {
            sb[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            sb[j - 4] |= (ls >> 4) << 6;
            sb[j] |= (lm >> 4) << 6;
        }
    }
    let d = put_f16(b, 0, max_scale / 63.0);
    let dmin = put_f16(b, 2, max_min / 63.0);
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        let range = 32 * j..32 * j + 32;
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        requantize(&x[range.clone()], dl, ml, 0, fit.nmax, &mut codes[range]);
    }
    codes
}

impl BlockQuantize for Q4_K {
    fn quantize(x: &[f32], b: &mut [u8]) {
        const FIT: Qkx2 = Qkx2 {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let codes = quantize_q45_k(&FIT, x, b);
        for (c, qs) in codes.chunks_exact(64).zip(b[16..144].chunks_exact_mut(32)) {
            for l in 0..32 {
                qs[l] = c[l] | (c[l + 32] << 4);
            }
        }
    }
}

impl BlockQuantize for Q5_K {
    fn quantize(x: &[f32], b: &mut [u8]) {
        const FIT: Qkx2 = Qkx2 {
            nmax: 31,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: false,
        };
        let codes = quantize_q45_k(&FIT, x, b);
        let (qh, qs) = b[16..176].split_at_mut(32);
        qh.fill(0);
        for (n, (c, qs)) in codes
            .chunks_exact(64)
            .zip(qs.chunks_exact_mut(32))
            .enumerate()
        {
            for l in 0..32 {
                let (lo, hi) = (c[l], c[l + 32]);
                qh[l] |= ((lo >> 4) << (2 * n)) | ((hi >> 4) << (2 * n + 1));
                qs[l] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            }
        }
    }
}

impl BlockQuantize for Q6_K {
    fn quantize(x: &[f32], b: &mut [u8]) {
        let mut codes = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs) = (0f32, 0f32);
        for (j, (x, c)) in x
            .chunks_exact(16)
            .zip(codes.chunks_exact_mut(16))
            .enumerate()
        {
            scales[j] = make_qx_quants(32, x, c);
            if scales[j].abs() > max_abs {
                max_abs = scales[j].abs();
                max_scale = scales[j];
            }
        }
        b[..210].fill(0);
        if max_abs < GROUP_MAX_EPS {
            return;
        }
        let iscale = -128.0 / max_scale;
        let d = put_f16(b, 208, 1.0 / iscale);
        for (s, &scale) in b[192..208].iter_mut().zip(&scales) {
            *s = nearest_int(iscale * scale).min(127) as i8 as u8;
        }
        let mut l = [0u8; QK_K];
        for (l, &c) in l.iter_mut().zip(&codes) {
            *l = c as u8;
        }
        for j in 0..16 {
            let dl = d * b[192 + j] as i8 as f32;
            requantize(
                &x[16 * j..16 * j + 16],
                dl,
                0.0,
                -32,
                31,
                &mut l[16 * j..16 * j + 16],
            );
        }
        let (ql, qh) = b[..192].split_at_mut(128);
        for ((c, ql), qh) in l
            .chunks_exact(128)
            .zip(ql.chunks_exact_mut(64))
            .zip(qh.chunks_exact_mut(32))
        {
            for i in 0..32 {
                let (q1, q2, q3, q4) = (c[i], c[i + 32], c[i + 64], c[i + 96]);
                ql[i] = (q1 & 0x0F) | ((q3 & 0x0F) << 4);
                ql[i + 32] = (q2 & 0x0F) | ((q4 & 0x0F) << 4);
                qh[i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

impl BlockQuantize for Q8_K {
    fn quantize(x: &[f32], b: &mut [u8]) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        b[..292].fill(0);
        if amax == 0.0 {
            return;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b[4..260].iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for j in 0..16 {
            let sum: i32 = b[4 + 16 * j..20 + 16 * j]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            b[260 + 2 * j..262 + 2 * j].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
