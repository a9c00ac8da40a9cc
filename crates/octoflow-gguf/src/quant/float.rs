//! Plain float element types: F32, F16 (IEEE half) and BF16 (the top 16 bits of an f32), one
//! little-endian value per element.

use half::{f16, slice::HalfFloatSliceExt};

use super::{lanes_dot, LANES};

/// Values per step of the row loops: decoded into a stack buffer, then used.
const CHUNK: usize = 64;

fn decode_f32(b: &[u8], out: &mut [f32]) {
    for (b, o) in b.chunks_exact(4).zip(out.iter_mut()) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// Converts through half's slice conversion, which uses the CPU's F16C instructions when it
/// has them (a scalar conversion is several times slower).
fn decode_f16(b: &[u8], out: &mut [f32]) {
    let mut h = [f16::ZERO; CHUNK];
    let n = out.len().min(CHUNK);
    for (h, b) in h.iter_mut().zip(b.chunks_exact(2)) {
        *h = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
    }
    h[..n].convert_to_f32_slice(&mut out[..n]);
}

fn decode_bf16(b: &[u8], out: &mut [f32]) {
    for (b, o) in b.chunks_exact(2).zip(out.iter_mut()) {
        *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
    }
}

/// Dequantizes a row of `width`-byte values, [`CHUNK`] at a time.
fn dequantize_with(data: &[u8], width: usize, out: &mut [f32], decode: fn(&[u8], &mut [f32])) {
    for (b, o) in data.chunks(CHUNK * width).zip(out.chunks_mut(CHUNK)) {
        decode(b, o);
    }
}

/// Dot of `x` with a row of `width`-byte values, decoded [`CHUNK`] at a time into a stack
/// buffer so that the multiply-adds vectorize.
fn dot_with(row: &[u8], width: usize, x: &[f32], decode: fn(&[u8], &mut [f32])) -> f32 {
    let mut buf = [0f32; CHUNK];
    let mut acc = [0f32; LANES];
    let full = x.len() / CHUNK * CHUNK;
    let (row_full, row_tail) = row.split_at(full * width);
    for (r, xs) in row_full
        .chunks_exact(CHUNK * width)
        .zip(x.chunks_exact(CHUNK))
    {
        decode(r, &mut buf);
        let p = lanes_dot(&buf, xs);
        for l in 0..LANES {
            acc[l] += p[l];
        }
    }
    let tail = &mut buf[..x.len() - full];
    decode(row_tail, tail);
    let tail: f32 = tail.iter().zip(&x[full..]).map(|(a, b)| a * b).sum();
    acc.iter().sum::<f32>() + tail
}

pub(super) fn dequantize_f32(data: &[u8], out: &mut [f32]) {
    dequantize_with(data, 4, out, decode_f32);
}

pub(super) fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    dot_with(row, 4, x, decode_f32)
}

pub(super) fn quantize_f32(src: &[f32], out: &mut [u8]) {
    for (v, b) in src.iter().zip(out.chunks_exact_mut(4)) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

pub(super) fn dequantize_f16(data: &[u8], out: &mut [f32]) {
    dequantize_with(data, 2, out, decode_f16);
}

pub(super) fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    dot_with(row, 2, x, decode_f16)
}

/// Round to nearest even, like numpy's `astype(float16)` and ggml's `GGML_FP32_TO_FP16`.
pub(super) fn quantize_f16(src: &[f32], out: &mut [u8]) {
    for (v, b) in src.iter().zip(out.chunks_exact_mut(2)) {
        b.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
    }
}

pub(super) fn dequantize_bf16(data: &[u8], out: &mut [f32]) {
    dequantize_with(data, 2, out, decode_bf16);
}

pub(super) fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_with(row, 2, x, decode_bf16)
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
