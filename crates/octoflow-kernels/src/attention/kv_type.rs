//! The KV cache's element type: what every kernel that reads or writes the cache (attention,
//! its decode and cooperative-matrix variants, RoPE-and-store) is built for (`KV_F16` in
//! `shaders/attention/kv.glsl`; the `*_kv16` variants in `shaders/variants.txt`).
//!
//! f16 halves the cache's memory and the bytes each attention step reads; values are rounded
//! once, when stored, and all arithmetic stays f32 (llama.cpp's default cache type is f16 too).
//! f32 stays for tests that hold the GPU to the f32 CPU reference.

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
}

impl KvType {
    /// The names [`KvType::from_str`] accepts, as llama.cpp spells its cache types.
    pub const NAMES: [&'static str; 2] = ["f32", "f16"];

    /// Bytes per cached value.
    pub fn bytes(self) -> u64 {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    /// The name llama.cpp gives the type (`f32`, `f16`).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }

    /// Whether a device can hold caches of this type (f16 needs 16-bit storage buffers).
    pub fn supported(self, caps: &DeviceCaps) -> bool {
        match self {
            KvType::F32 => true,
            KvType::F16 => caps.storage_16bit,
        }
    }

    /// `x` as the cache holds it: the CPU reference of a store.
    pub fn round(self, x: f32) -> f32 {
        match self {
            KvType::F32 => x,
            KvType::F16 => f16::from_f32(x).to_f32(),
        }
    }

    /// `xs` encoded as the cache's bytes (little-endian): uploads of test caches.
    pub fn encode(self, xs: &[f32]) -> Vec<u8> {
        match self {
            KvType::F32 => xs.iter().flat_map(|x| x.to_le_bytes()).collect(),
            KvType::F16 => xs
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
        }
    }

    /// The values of cache bytes `bytes` (whole elements; a partial one at the end is ignored).
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
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One of a kernel's things per cache type: its pipelines built for f32 caches and for f16
/// caches (the `*_kv16` variants).
pub(crate) struct PerKv<T> {
    pub(crate) f32: T,
    pub(crate) f16: T,
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
        })
    }
}

/// A cache type name that is not one of [`KvType::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown KV cache type {0:?} (expected one of: f32, f16)")]
pub struct UnknownKvType(pub String);

impl FromStr for KvType {
    type Err = UnknownKvType;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
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
        let e = "q8_0".parse::<KvType>().unwrap_err().to_string();
        assert!(e.contains("q8_0") && e.contains("f32, f16"), "{e}");
    }

    #[test]
    fn encode_and_decode_round_as_a_store_does() {
        let xs = [1.0f32, -2.5, 1.0 + 1.0 / 4096.0, 65504.0, 3.0e-8];
        for ty in [KvType::F32, KvType::F16] {
            let back = ty.decode(&ty.encode(&xs));
            assert_eq!(back.len(), xs.len());
            assert_eq!(ty.encode(&xs).len() as u64, ty.bytes() * xs.len() as u64);
            for (&x, &y) in xs.iter().zip(&back) {
                assert_eq!(y, ty.round(x), "{ty} {x}");
            }
        }
        // 1 + 2^-12 is halfway between two f16 values: it rounds to even (1.0)
        assert_eq!(KvType::F16.round(1.0 + 1.0 / 4096.0), 1.0);
        assert_eq!(KvType::F32.round(1.0 + 1.0 / 4096.0), 1.0 + 1.0 / 4096.0);
    }
}
