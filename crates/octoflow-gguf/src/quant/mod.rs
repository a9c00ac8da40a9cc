//! GGML quant block formats on the CPU: dequantize to f32, quantize from f32, and a fused
//! dequantize-and-dot of one quantized row with an f32 vector.
//!
//! A tensor of a block type is a sequence of blocks; block `i` holds elements
//! `[i*block_size, (i+1)*block_size)` in `type_size` bytes (see [`GgmlType::block_size`],
//! [`GgmlType::type_size`]). All multi-byte fields are little-endian; scales are IEEE f16 unless
//! said otherwise. The layouts and the reference quantizers follow ggml (`ggml-common.h`,
//! `quantize_row_*_ref` in `ggml-quants.c`, i.e. without an importance matrix).
//!
//! | format | dequantize | quantize |
//! |---|---|---|
//! | F32, F16, BF16 | yes | yes |
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 | yes | yes |
//! | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K | yes | yes |
//! | MXFP4 | yes | yes |
//! | IQ4_NL, IQ4_XS | yes | no |
//!
//! # Verified against outside references (tests/quant_fixtures.rs, fixtures made by
//! tests/fixtures/quant/make_fixtures.py)
//!
//! - **Dequantization, bit-exact against gguf-py 0.19** (`gguf.quants.dequantize`): F16, BF16,
//!   Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, IQ4_NL, IQ4_XS, on
//!   synthetic blocks and on the first blocks of real tensors of the three models (Q4_1, Q5_0,
//!   Q8_0, Q4_K, Q6_K, F32). gguf-py has no Q8_1 or Q8_K; those are checked by round trips only.
//! - **Quantization, bit-exact against gguf-py 0.19** (`gguf.quants.quantize`): F16, BF16, Q4_0,
//!   Q4_1, Q5_0, Q5_1, Q8_0, MXFP4.
//! - **Quantization, bit-exact against ggml's C reference quantizers** (`quantize_row_*_ref`,
//!   compiled from ggml's source by the fixture script, since gguf-py has no K-quant quantizer):
//!   Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, Q8_1. (gguf-py's legacy quantizers agree with ggml's
//!   on every fixture case. Beyond the committed fixtures, both comparisons were also run once on
//!   ~55 MB of extra random blocks: 12 more seeds of the committed cases and 8 other input
//!   distributions, all bit-exact.)
//! - Every quantizer also has a round-trip error bound on fresh random input (`tests.rs`).

mod float;
mod iq4_xs;
mod k_dequant;
mod k_quantize;
mod k_search;
mod legacy;
mod mxfp4;
#[cfg(test)]
mod tests;

use crate::types::GgmlType;

/// Why a quant operation could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The type has no CPU codec for this operation.
    #[error("{op} is not supported for tensor type {ty}")]
    Unsupported { ty: GgmlType, op: &'static str },
    /// The element count does not fill whole blocks.
    #[error("{ty}: {n_elements} elements is not a whole number of {block_size}-element blocks")]
    PartialBlock {
        ty: GgmlType,
        n_elements: usize,
        block_size: usize,
    },
    /// The quantized buffer does not have the size that the element count implies.
    #[error(
        "{ty}: {n_elements} elements take {expected} bytes, but the quantized buffer has {found}"
    )]
    ByteLength {
        ty: GgmlType,
        n_elements: usize,
        expected: usize,
        found: usize,
    },
    /// The f32 vector of a row dot product does not match the row's element count.
    #[error("{ty}: the row holds {expected} elements, but the vector has {found}")]
    VectorLength {
        ty: GgmlType,
        expected: usize,
        found: usize,
    },
    /// The byte size of the tensor does not fit in `usize`.
    #[error("{ty}: the byte size of {n_elements} elements overflows")]
    Overflow { ty: GgmlType, n_elements: usize },
}

/// Bytes taken by `n_elements` elements of type `ty`.
pub fn quantized_size(ty: GgmlType, n_elements: usize) -> Result<usize, QuantError> {
    let block_size = ty.block_size();
    if !n_elements.is_multiple_of(block_size) {
        return Err(QuantError::PartialBlock {
            ty,
            n_elements,
            block_size,
        });
    }
    (n_elements / block_size)
        .checked_mul(ty.type_size())
        .ok_or(QuantError::Overflow { ty, n_elements })
}

/// Whether [`dequantize`] and [`dot_row`] handle `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    codec(ty).is_some()
}

/// Whether [`quantize`] handles `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    codec(ty).is_some_and(|c| c.quantize.is_some())
}

/// Dequantizes `out.len()` elements of type `ty` from `data` into `out`.
///
/// `data` must hold exactly `quantized_size(ty, out.len())` bytes.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let c = codec(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "dequantization",
    })?;
    check_bytes(ty, out.len(), data.len())?;
    (c.dequantize)(data, out);
    Ok(())
}

/// Quantizes `src` into `out` with ggml's reference quantizer for `ty`.
///
/// `out` must hold exactly `quantized_size(ty, src.len())` bytes.
pub fn quantize(ty: GgmlType, src: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    let q = codec(ty)
        .and_then(|c| c.quantize)
        .ok_or(QuantError::Unsupported {
            ty,
            op: "quantization",
        })?;
    check_bytes(ty, src.len(), out.len())?;
    q(src, out);
    Ok(())
}

/// The dot product of one quantized row (`row`, whole blocks of type `ty`) with `x`, without
/// materializing the dequantized row. `x.len()` must equal the row's element count.
///
/// The sum is accumulated in a different order than `dequantize` followed by a sequential dot,
/// so the two agree to rounding, not bit for bit.
pub fn dot_row(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let c = codec(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "row dot product",
    })?;
    let expected = row.len() / ty.type_size() * ty.block_size();
    if x.len() != expected {
        return Err(QuantError::VectorLength {
            ty,
            expected,
            found: x.len(),
        });
    }
    check_bytes(ty, x.len(), row.len())?;
    Ok((c.dot)(row, x))
}

fn check_bytes(ty: GgmlType, n_elements: usize, found: usize) -> Result<(), QuantError> {
    let expected = quantized_size(ty, n_elements)?;
    if expected != found {
        return Err(QuantError::ByteLength {
            ty,
            n_elements,
            expected,
            found,
        });
    }
    Ok(())
}

/// The row-level functions of one format. Each is called only with lengths already checked:
/// whole blocks, and `data.len() / type_size * block_size == values.len()`.
struct Codec {
    dequantize: DequantizeFn,
    dot: DotFn,
    quantize: Option<QuantizeFn>,
}

type DequantizeFn = fn(&[u8], &mut [f32]);
type DotFn = fn(&[u8], &[f32]) -> f32;
type QuantizeFn = fn(&[f32], &mut [u8]);

fn codec(ty: GgmlType) -> Option<Codec> {
    use GgmlType as T;
    macro_rules! blocks {
        ($m:ident :: $f:ident) => {
            Codec {
                dequantize: dequantize_blocks::<$m::$f>,
                dot: dot_blocks::<$m::$f>,
                quantize: Some(quantize_blocks::<$m::$f>),
            }
        };
    }
    Some(match ty {
        T::F32 => Codec {
            dequantize: float::dequantize_f32,
            dot: float::dot_f32,
            quantize: Some(float::quantize_f32),
        },
        T::F16 => Codec {
            dequantize: float::dequantize_f16,
            dot: float::dot_f16,
            quantize: Some(float::quantize_f16),
        },
        T::BF16 => Codec {
            dequantize: float::dequantize_bf16,
            dot: float::dot_bf16,
            quantize: Some(float::quantize_bf16),
        },
        T::Q4_0 => blocks!(legacy::Q4_0),
        T::Q4_1 => blocks!(legacy::Q4_1),
        T::Q5_0 => blocks!(legacy::Q5_0),
        T::Q5_1 => blocks!(legacy::Q5_1),
        T::Q8_0 => blocks!(legacy::Q8_0),
        T::Q8_1 => blocks!(legacy::Q8_1),
        T::IQ4_NL => Codec {
            dequantize: dequantize_blocks::<legacy::IQ4_NL>,
            dot: dot_blocks::<legacy::IQ4_NL>,
            quantize: None,
        },
        T::IQ4_XS => Codec {
            dequantize: dequantize_blocks::<iq4_xs::IQ4_XS>,
            dot: dot_blocks::<iq4_xs::IQ4_XS>,
            quantize: None,
        },
        T::MXFP4 => blocks!(mxfp4::MXFP4),
        T::Q2_K => blocks!(k_dequant::Q2_K),
        T::Q3_K => blocks!(k_dequant::Q3_K),
        T::Q4_K => blocks!(k_dequant::Q4_K),
        T::Q5_K => blocks!(k_dequant::Q5_K),
        T::Q6_K => blocks!(k_dequant::Q6_K),
        T::Q8_K => blocks!(k_dequant::Q8_K),
        _ => return None,
    })
}

/// One block format: `ELEMS` values in `BYTES` bytes.
///
/// `block` always has `BYTES` bytes and `values` `ELEMS` elements; implementations slice with
/// constant ranges so that the compiler can drop the bounds checks of their inner loops.
trait BlockFormat {
    const ELEMS: usize;
    const BYTES: usize;
    fn dequantize(block: &[u8], values: &mut [f32]);
    /// Adds the block's `dequantized[i] * x[i]` into the lanes of `acc`.
    fn dot(block: &[u8], x: &[f32], acc: &mut Lanes);
}

/// A block format with a reference quantizer.
trait BlockQuantize: BlockFormat {
    fn quantize(values: &[f32], block: &mut [u8]);
}

fn dequantize_blocks<F: BlockFormat>(data: &[u8], out: &mut [f32]) {
    for (b, v) in data
        .chunks_exact(F::BYTES)
        .zip(out.chunks_exact_mut(F::ELEMS))
    {
        F::dequantize(b, v);
    }
}

fn dot_blocks<F: BlockFormat>(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (b, x) in row.chunks_exact(F::BYTES).zip(x.chunks_exact(F::ELEMS)) {
        F::dot(b, x, &mut acc);
    }
    acc.iter().sum()
}

fn quantize_blocks<F: BlockQuantize>(src: &[f32], out: &mut [u8]) {
    for (v, b) in src
        .chunks_exact(F::ELEMS)
        .zip(out.chunks_exact_mut(F::BYTES))
    {
        F::quantize(v, b);
    }
}

/// Reads the little-endian f16 at `b[at..at + 2]` as f32.
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Rounds `v` to f16 (round to nearest even, as ggml's `GGML_FP32_TO_FP16`) and stores it at
/// `b[at..at + 2]`; returns the stored value as f32, which is what a decoder will see.
#[inline(always)]
fn put_f16(b: &mut [u8], at: usize, v: f32) -> f32 {
    let h = half::f16::from_f32(v);
    b[at..at + 2].copy_from_slice(&h.to_bits().to_le_bytes());
    h.to_f32()
}

const LANES: usize = 8;

/// Partial sums of a row dot product, kept in independent lanes across the whole row so that
/// the multiply-adds vectorize and the horizontal sum happens once per row.
type Lanes = [f32; LANES];

/// Lane-wise `sum(a[i] * b[i])`; `a.len()` is a multiple of [`LANES`] (every block size is).
#[inline(always)]
fn lanes_dot(a: &[f32], b: &[f32]) -> Lanes {
    let mut acc = [0f32; LANES];
    for (a, b) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] += a[l] * b[l];
        }
    }
    acc
}

/// Lane-wise `sum(a[i])`; `a.len()` is a multiple of [`LANES`].
#[inline(always)]
fn lanes_sum(a: &[f32]) -> Lanes {
    let mut acc = [0f32; LANES];
    for a in a.chunks_exact(LANES) {
        for l in 0..LANES {
            acc[l] += a[l];
        }
    }
    acc
}

/// `acc += d * p`, lane-wise.
#[inline(always)]
fn lanes_add_scaled(acc: &mut Lanes, d: f32, p: &Lanes) {
    for l in 0..LANES {
        acc[l] += d * p[l];
    }
}
