//! The KV cache's element type: what every kernel that reads or writes the cache (attention,
//! its decode and cooperative-matrix variants, RoPE-and-store) is built for (`KV_F16` and
//! `KV_Q8` in `shaders/attention/kv.glsl`; the `*_kv16` and `*_kvq8` variants in
//! `shaders/variants.txt`).
//!
//! f16 halves the cache's memory and the bytes each attention step reads; values are rounded
//! once, when stored, and all arithmetic stays f32 (llama.cpp's default cache type is f16 too).
//! q8_0 quantizes each run of 32 values of a cache row as llama.cpp's q8_0 does (a scale of
//! max|x| / 127 rounded to f16, values rounded half away from zero to int8), at 36 bytes per
//! block on the GPU: the scale as an f32 word, then the 32 int8s, so that every block starts on a
//! 4-byte word. f32 stays for tests that hold the GPU to the f32 CPU reference.

use std::fmt;
use std::str::FromStr;

use half::f16;
use octoflow_vk::DeviceCaps;

use crate::error::Result;
use crate::operand::bad;

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvType {
    /// 4 bytes per value: the CPU reference's own precision.
    F32,
    /// 2 bytes per value (IEEE half, rounded to nearest even when stored): the product's
    /// default (`--cache-type`).
    F16,
    /// Blocks of 32 values (a scale and 32 int8s, 36 bytes): llama.cpp's q8_0 cache type.
    /// Rows (a position's keys or values) must be whole blocks: head sizes multiple of 32.
    Q8_0,
}

/// Values per q8_0 block.
pub const Q8_BLOCK: usize = 32;
/// Bytes per q8_0 block on the GPU: the f32 scale word, then 32 int8s.
const Q8_BLOCK_BYTES: u64 = 36;

impl KvType {
    /// The names [`KvType::from_str`] accepts, as llama.cpp spells its cache types.
    pub const NAMES: [&'static str; 3] = ["f32", "f16", "q8_0"];

    /// Bytes that `values` cached values take (for q8_0 a whole number of blocks: `values` is
    /// rounded up to one; saturating at u64::MAX).
    pub fn bytes_for(self, values: u64) -> u64 {
        match self {
            KvType::F32 => values.saturating_mul(4),
            KvType::F16 => values.saturating_mul(2),
            KvType::Q8_0 => values
                .div_ceil(Q8_BLOCK as u64)
                .saturating_mul(Q8_BLOCK_BYTES),
        }
    }

    /// The name llama.cpp gives the type (`f32`, `f16`, `q8_0`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Whether a device can hold caches of this type (f16 needs 16-bit storage buffers; q8_0
    /// is read and written as 32-bit words).
    pub fn supported(self, caps: &DeviceCaps) -> bool {
        match self {
            KvType::F32 | KvType::Q8_0 => true,
            KvType::F16 => caps.storage_16bit,
        }
    }

    /// Why heads of `head_dim` keys and `head_dim_v` values cannot be cached as this type, if
    /// they cannot (see [`Self::check_width`]).
    pub fn check_heads(
        self,
        head_dim: usize,
        head_dim_v: usize,
    ) -> std::result::Result<(), String> {
        self.check_width("key", head_dim)
            .and_then(|()| self.check_width("value", head_dim_v))
    }

    /// Why rows of `width` values (one head's keys or values) cannot be cached as this type,
    /// if they cannot: q8_0 blocks never straddle two heads.
    pub fn check_width(self, what: &str, width: usize) -> std::result::Result<(), String> {
        if self == KvType::Q8_0 && (width == 0 || !width.is_multiple_of(Q8_BLOCK)) {
            return Err(format!(
                "a q8_0 KV cache needs heads of a multiple of {Q8_BLOCK} values, and the {what} head size is {width} (use f16)"
            ));
        }
        Ok(())
    }

    /// `xs` as the cache holds them: the CPU reference of a store (for q8_0, `xs` is a whole
    /// number of blocks, each run of 32 values quantized together).
    pub fn round(self, xs: &[f32]) -> Vec<f32> {
        self.decode(&self.encode(xs))
    }

    /// `xs` encoded as the cache's bytes (little-endian): uploads of test caches (q8_0: a
    /// partial block at the end is padded with zeros).
    pub fn encode(self, xs: &[f32]) -> Vec<u8> {
        match self {
            KvType::F32 => xs.iter().flat_map(|x| x.to_le_bytes()).collect(),
            KvType::F16 => xs
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
            KvType::Q8_0 => xs
                .chunks(Q8_BLOCK)
                .flat_map(|b| {
                    let (d, q) = q8_block(b);
                    let mut out = d.to_le_bytes().to_vec();
                    out.extend(q.iter().map(|&v| v as u8));
                    out
                })
                .collect(),
        }
    }

    /// The values of cache bytes `bytes` (whole elements or blocks; a partial one at the end is
    /// ignored).
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            KvType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            KvType::F16 => bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            KvType::Q8_0 => bytes
                .chunks_exact(Q8_BLOCK_BYTES as usize)
                .flat_map(|b| {
                    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    b[4..].iter().map(move |&q| f32::from(q as i8) * d)
                })
                .collect(),
        }
    }
}

/// One q8_0 block of up to 32 values (missing ones are zeros) as llama.cpp quantizes it:
/// d = max|x| / 127, q = round(x / d) half away from zero (x times 1/d, as llama.cpp computes
/// it), the scale kept as d rounded to f16.
pub fn q8_block(xs: &[f32]) -> (f32, [i8; Q8_BLOCK]) {
    let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; Q8_BLOCK];
    for (q, &x) in q.iter_mut().zip(xs) {
        // |x * id| <= 127 up to rounding; the clamp keeps NaN-free inputs in range
        *q = (x * id).round().clamp(-127.0, 127.0) as i8;
    }
    (f16::from_f32(d).to_f32(), q)
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One of a kernel's things per cache type: its pipelines built for f32 caches, f16 caches (the
/// `*_kv16` variants) and q8_0 caches (`*_kvq8`).
pub(crate) struct PerKv<T> {
    pub(crate) f32: T,
    pub(crate) f16: T,
    pub(crate) q8: T,
}

impl<T> PerKv<T> {
    /// The one for `kv`, or a clear error where the device cannot hold such caches.
    pub(crate) fn get(&self, op: &'static str, caps: &DeviceCaps, kv: KvType) -> Result<&T> {
        if !kv.supported(caps) {
            return Err(bad(
                op,
                format!(
                    "{} has no 16-bit storage buffers, which an {kv} KV cache needs (use f32)",
                    caps.name
                ),
            ));
        }
        Ok(match kv {
            KvType::F32 => &self.f32,
            KvType::F16 => &self.f16,
            KvType::Q8_0 => &self.q8,
        })
    }
}

/// Checks values a kernel stored in a q8_0 cache (`got`, decoded) against the exact values
/// (`exact`, whole blocks): each within half a step of its block (d = max|x| / 127, plus what
/// the f16 scale's rounding adds) plus `rel` of itself for the kernel's own arithmetic, and
/// nearly all equal to the CPU's quantization of the exact values (a value a hair from a
/// rounding boundary may land on the other step). NaN never passes.
#[cfg(test)]
pub(crate) fn check_q8(got: &[f32], exact: &[f32], rel: f32) -> std::result::Result<(), String> {
    if got.len() != exact.len() || !exact.len().is_multiple_of(Q8_BLOCK) {
        return Err(format!("{} values against {}", got.len(), exact.len()));
    }
    let cpu = KvType::Q8_0.round(exact);
    let mut differ = 0;
    for (b, (gs, xs)) in got.chunks(Q8_BLOCK).zip(exact.chunks(Q8_BLOCK)).enumerate() {
        let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        // the values come back as q times the scale's f16 rounding: off by q |d16 - d| more
        let skew = (f16::from_f32(d).to_f32() - d).abs() / d.max(f32::MIN_POSITIVE);
        for (i, (&g, &x)) in gs.iter().zip(xs).enumerate() {
            let e = (g - x).abs();
            // plus the f32 rounding of `g - x` and of the bound itself, which a value at a tie
            // (x = (q + 1/2) d, rounded away from zero) meets exactly
            let bound = 0.5 * d * (1.0 + skew)
                + x.abs() * (skew + rel)
                + 1e-6 * d
                + 4.0 * f32::EPSILON * x.abs();
            if e.is_nan() || e > bound {
                return Err(format!(
                    "block {b} value {i}: {g} for {x} (max |x| of the block {amax}: more than half a step off)"
                ));
            }
        }
        differ += gs
            .iter()
            .zip(&cpu[b * Q8_BLOCK..(b + 1) * Q8_BLOCK])
            .filter(|(g, c)| g.to_bits() != c.to_bits())
            .count();
    }
    if differ * 100 > got.len() {
        return Err(format!(
            "{differ} of {} values differ from the CPU's quantization",
            got.len()
        ));
    }
    Ok(())
}

/// A cache type name that is not one of [`KvType::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown KV cache type {0:?} (expected one of: f32, f16, q8_0)")]
pub struct UnknownKvType(pub String);

impl FromStr for KvType {
    type Err = UnknownKvType;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            _ => Err(UnknownKvType(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_ones_are_a_clear_error() {
        for name in KvType::NAMES {
            assert_eq!(name.parse::<KvType>().unwrap().name(), name);
        }
        assert_eq!("F16".parse::<KvType>().unwrap(), KvType::F16);
        let e = "q4_0".parse::<KvType>().unwrap_err().to_string();
        assert!(e.contains("q4_0") && e.contains("f32, f16, q8_0"), "{e}");
    }

    #[test]
    fn encode_and_decode_round_as_a_store_does() {
        let xs = [1.0f32, -2.5, 1.0 + 1.0 / 4096.0, 65504.0, 3.0e-8];
        for ty in [KvType::F32, KvType::F16] {
            let back = ty.decode(&ty.encode(&xs));
            assert_eq!(back.len(), xs.len());
            assert_eq!(ty.encode(&xs).len() as u64, ty.bytes_for(xs.len() as u64));
            assert_eq!(back, ty.round(&xs));
        }
        // 1 + 2^-12 is halfway between two f16 values: it rounds to even (1.0)
        assert_eq!(KvType::F16.round(&[1.0 + 1.0 / 4096.0]), [1.0]);
        assert_eq!(
            KvType::F32.round(&[1.0 + 1.0 / 4096.0]),
            [1.0 + 1.0 / 4096.0]
        );
    }

    #[test]
    fn q8_0_blocks_are_llama_cpp_s() {
        // a block with max |x| = 127: d = 1, values rounded half away from zero
        let mut xs = [0f32; 64];
        for (i, x) in xs.iter_mut().enumerate().take(32) {
            *x = i as f32 - 15.5;
        }
        xs[31] = -127.0;
        // the second block: all zeros (d = 0, no division by it)
        let bytes = KvType::Q8_0.encode(&xs);
        assert_eq!(bytes.len(), 72);
        assert_eq!(KvType::Q8_0.bytes_for(64), 72);
        assert_eq!(
            f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            1.0
        );
        assert_eq!(bytes[4] as i8, -16); // -15.5 rounds away from zero
        assert_eq!(bytes[4 + 16] as i8, 1); // 0.5 too
        assert_eq!(bytes[4 + 31] as i8, -127);
        assert!(bytes[36..].iter().all(|&b| b == 0));
        let back = KvType::Q8_0.decode(&bytes);
        assert_eq!(back.len(), 64);
        assert_eq!(back[0], -16.0);
        assert_eq!(back[31], -127.0);
        // a scale that f16 cannot hold exactly is kept as its f16 rounding, the int8s are
        // computed with the unrounded one (llama.cpp's order)
        let ys: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.0123).collect();
        let (d, q) = q8_block(&ys);
        assert_eq!(d, f16::from_f32(16.0 * 0.0123 / 127.0).to_f32());
        let d32 = 16.0f32 * 0.0123 / 127.0;
        for (&y, &q) in ys.iter().zip(&q) {
            assert_eq!(q, (y * (1.0 / d32)).round() as i8, "{y}");
        }
        // values come back within half a step of the block's scale
        for (&y, &z) in ys.iter().zip(&KvType::Q8_0.round(&ys)) {
            assert!((y - z).abs() <= 0.5 * d * 1.01, "{y} {z}");
        }
        // the stored-value check: the CPU's own quantization passes, a value a whole step off,
        // a scale left unrounded by more than f16 allows, or NaN does not
        let rounded = KvType::Q8_0.round(&ys);
        check_q8(&rounded, &ys, 0.0).unwrap();
        let mut off = rounded.clone();
        off[5] += d;
        assert!(check_q8(&off, &ys, 0.0).is_err());
        let scaled: Vec<f32> = rounded.iter().map(|x| x * 1.01).collect();
        assert!(check_q8(&scaled, &ys, 0.0).is_err());
        off[5] = f32::NAN;
        assert!(check_q8(&off, &ys, 0.0).is_err());
        assert!(KvType::Q8_0.check_width("key", 64).is_ok());
        let e = KvType::Q8_0.check_width("value", 40).unwrap_err();
        assert!(e.contains("32") && e.contains("40"), "{e}");
        assert!(KvType::F16.check_width("value", 40).is_ok());
    }
}
