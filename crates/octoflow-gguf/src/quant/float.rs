//! Plain float element types: F32, F16 (IEEE half) and BF16 (the top 16 bits of an f32), one
//! little-endian value per element.

use half::f16;

pub(super) fn dequantize_f32(data: &[u8], out: &mut [f32]) {
    for (b, o) in data.chunks_exact(4).zip(out.iter_mut()) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub(super) fn quantize_f32(src: &[f32], out: &mut [u8]) {
    for (v, b) in src.iter().zip(out.chunks_exact_mut(4)) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

pub(super) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    dot_decoded(row, 4, x, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

pub(super) fn dequantize_f16(data: &[u8], out: &mut [f32]) {
    for (b, o) in data.chunks_exact(2).zip(out.iter_mut()) {
        *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    }
}

/// Round to nearest even, like numpy's `astype(float16)` and ggml's F16C path.
pub(super) fn quantize_f16(src: &[f32], out: &mut [u8]) {
    for (v, b) in src.iter().zip(out.chunks_exact_mut(2)) {
        b.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
    }
}

pub(super) fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    dot_decoded(row, 2, x, |b| {
        f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
    })
}

#[inline(always)]
fn bf16_to_f32(b: &[u8]) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16)
}

pub(super) fn dequantize_bf16(data: &[u8], out: &mut [f32]) {
    for (b, o) in data.chunks_exact(2).zip(out.iter_mut()) {
        *o = bf16_to_f32(b);
    }
}

/// ggml's `ggml_compute_fp32_to_bf16`: NaNs become quiet NaNs with the same sign and top
/// payload bits; everything else rounds to nearest even (overflowing to infinity).
fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

pub(super) fn quantize_bf16(src: &[f32], out: &mut [u8]) {
    for (v, b) in src.iter().zip(out.chunks_exact_mut(2)) {
        b.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
    }
}

pub(super) fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_decoded(row, 2, x, bf16_to_f32)
}

/// Dot of `x` with a row of `width`-byte values decoded by `decode`, 64 values at a time through
/// a stack buffer so that the multiply-add loop vectorizes.
#[inline(always)]
fn dot_decoded(row: &[u8], width: usize, x: &[f32], decode: impl Fn(&[u8]) -> f32) -> f32 {
    const CHUNK: usize = 64;
    let mut buf = [0f32; CHUNK];
    let mut sum = 0f32;
    for (r, xs) in row.chunks(CHUNK * width).zip(x.chunks(CHUNK)) {
        for (o, b) in buf.iter_mut().zip(r.chunks_exact(width)) {
            *o = decode(b);
        }
        sum += super::dot_f32(&buf[..xs.len()], xs);
    }
    sum
}
