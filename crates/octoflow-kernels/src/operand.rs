//! Operand checks shared by the kernels' `record` methods (and buffer helpers for their tests).

use octoflow_vk::BufferSlice;

use crate::error::{KernelError, Result};

/// How a kernel finds the position of token `t` in its u32 `pos` buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Positions {
    /// One sequence: token `t` is at position `pos[pos_offset] + t`, and position `p`'s keys and
    /// values are cache row `p`.
    #[default]
    Run,
    /// Several sequences in paged caches: token `t` is at position `pos[pos_offset + 2t]` of the
    /// sequence whose block table starts at `pos[pos[pos_offset + 2t + 1]]` (see
    /// [`crate::attention::page`]).
    Table,
}

impl Positions {
    /// u32 words of `pos` read from `pos_offset` on, for `n_tokens` tokens.
    pub(crate) fn words(self, n_tokens: u32) -> u128 {
        match self {
            Positions::Run => 1,
            Positions::Table => 2 * u128::from(n_tokens),
        }
    }

    /// The shaders' `table` push constant.
    pub(crate) fn flag(self) -> u32 {
        u32::from(self == Positions::Table)
    }
}

/// Checks that `s` holds at least `elems` 4-byte values (f32 or u32).
pub(crate) fn need(op: &'static str, name: &str, s: &BufferSlice, elems: u128) -> Result<()> {
    if u128::from(s.size) < 4 * elems {
        let detail = format!(
            "{name} ({}) holds {} bytes, {elems} values need {}",
            s.buffer.name(),
            s.size,
            4 * elems
        );
        return Err(KernelError::Shape { op, detail });
    }
    Ok(())
}

/// Like [`need`] for a KV cache of `kv` values.
pub(crate) fn need_kv(
    op: &'static str,
    name: &str,
    s: &BufferSlice,
    elems: u128,
    kv: crate::KvType,
) -> Result<()> {
    let bytes = u128::from(kv.bytes_for(u64::try_from(elems).unwrap_or(u64::MAX)));
    if u128::from(s.size) < bytes {
        let detail = format!(
            "{name} ({}) holds {} bytes, {elems} {kv} values need {bytes}",
            s.buffer.name(),
            s.size,
        );
        return Err(KernelError::Shape { op, detail });
    }
    Ok(())
}

/// A shape error of `op`.
pub(crate) fn bad(op: &'static str, detail: String) -> KernelError {
    KernelError::Shape { op, detail }
}

/// Whether two slices share bytes of one buffer.
pub(crate) fn overlap(a: &BufferSlice, b: &BufferSlice) -> bool {
    a.buffer.raw() == b.buffer.raw() && a.offset < b.offset + b.size && b.offset < a.offset + a.size
}

/// Whether two slices are the same bytes of the same buffer.
pub(crate) fn same(a: &BufferSlice, b: &BufferSlice) -> bool {
    a.buffer.raw() == b.buffer.raw() && a.offset == b.offset && a.size == b.size
}
