//! What the quantized kernels share: the weight types they read, one shader variant per type,
//! and checks of GGUF-encoded weight slices bound as `uint` word arrays (`shaders/quant.glsl`).

use octoflow_gguf::GgmlType;
use octoflow_vk::{BufferSlice, Shader};

use crate::error::{KernelError, Result};
use crate::shaders;

/// The weight types `quant.glsl` decodes, in the order of [`variant`]'s tables.
pub(crate) const TYPES: [GgmlType; 10] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The quantized ops, each built once per type in [`TYPES`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum QOp {
    Matvec,
    /// `matvec` with the gated linear unit fused (`matvec.comp` with `GLU`).
    MatvecGlu,
    Matmul,
    /// `matvec` for CPU drivers (`linear_cpu.comp`, 4 tokens per workgroup).
    MatvecCpu,
    /// `matvec_glu` for CPU drivers (`linear_cpu.comp` with `GLU`).
    MatvecGluCpu,
    /// `matmul` for CPU drivers (`linear_cpu.comp`, 16 tokens per workgroup).
    MatmulCpu,
    /// `matmul` on cooperative matrices (`matmul_coop.comp`).
    MatmulCoop,
    /// `matmul_coop` with 128 tokens per workgroup.
    MatmulCoopWide,
    /// `matmul_coop` with 64 rows per workgroup.
    MatmulCoopSmall,
    /// `matmul_coop` of gate and up with the activation (`GLU`).
    MatmulCoopGlu,
    /// `matmul_coop_glu` with 64 tokens per workgroup.
    MatmulCoopGluSmall,
    GetRows,
}

/// The shader variant of `op` for `TYPES[i]`.
pub(crate) fn variant(op: QOp, i: usize) -> Shader {
    use shaders as s;
    let table: [Shader; 10] = match op {
        QOp::Matvec => [
            s::MATVEC_F32,
            s::MATVEC_F16,
            s::MATVEC_Q4_0,
            s::MATVEC_Q4_1,
            s::MATVEC_Q5_0,
            s::MATVEC_Q5_1,
            s::MATVEC_Q8_0,
            s::MATVEC_Q4_K,
            s::MATVEC_Q5_K,
            s::MATVEC_Q6_K,
        ],
        QOp::MatvecGlu => [
            s::MATVEC_GLU_F32,
            s::MATVEC_GLU_F16,
            s::MATVEC_GLU_Q4_0,
            s::MATVEC_GLU_Q4_1,
            s::MATVEC_GLU_Q5_0,
            s::MATVEC_GLU_Q5_1,
            s::MATVEC_GLU_Q8_0,
            s::MATVEC_GLU_Q4_K,
            s::MATVEC_GLU_Q5_K,
            s::MATVEC_GLU_Q6_K,
        ],
        QOp::Matmul => [
            s::MATMUL_F32,
            s::MATMUL_F16,
            s::MATMUL_Q4_0,
            s::MATMUL_Q4_1,
            s::MATMUL_Q5_0,
            s::MATMUL_Q5_1,
            s::MATMUL_Q8_0,
            s::MATMUL_Q4_K,
            s::MATMUL_Q5_K,
            s::MATMUL_Q6_K,
        ],
        QOp::MatvecCpu => [
            s::MATVEC_CPU_F32,
            s::MATVEC_CPU_F16,
            s::MATVEC_CPU_Q4_0,
            s::MATVEC_CPU_Q4_1,
            s::MATVEC_CPU_Q5_0,
            s::MATVEC_CPU_Q5_1,
            s::MATVEC_CPU_Q8_0,
            s::MATVEC_CPU_Q4_K,
            s::MATVEC_CPU_Q5_K,
            s::MATVEC_CPU_Q6_K,
        ],
        QOp::MatvecGluCpu => [
            s::MATVEC_GLU_CPU_F32,
            s::MATVEC_GLU_CPU_F16,
            s::MATVEC_GLU_CPU_Q4_0,
            s::MATVEC_GLU_CPU_Q4_1,
            s::MATVEC_GLU_CPU_Q5_0,
            s::MATVEC_GLU_CPU_Q5_1,
            s::MATVEC_GLU_CPU_Q8_0,
            s::MATVEC_GLU_CPU_Q4_K,
            s::MATVEC_GLU_CPU_Q5_K,
            s::MATVEC_GLU_CPU_Q6_K,
        ],
        QOp::MatmulCpu => [
            s::MATMUL_CPU_F32,
            s::MATMUL_CPU_F16,
            s::MATMUL_CPU_Q4_0,
            s::MATMUL_CPU_Q4_1,
            s::MATMUL_CPU_Q5_0,
            s::MATMUL_CPU_Q5_1,
            s::MATMUL_CPU_Q8_0,
            s::MATMUL_CPU_Q4_K,
            s::MATMUL_CPU_Q5_K,
            s::MATMUL_CPU_Q6_K,
        ],
        QOp::MatmulCoop => [
            s::MATMUL_COOP_F32,
            s::MATMUL_COOP_F16,
            s::MATMUL_COOP_Q4_0,
            s::MATMUL_COOP_Q4_1,
            s::MATMUL_COOP_Q5_0,
            s::MATMUL_COOP_Q5_1,
            s::MATMUL_COOP_Q8_0,
            s::MATMUL_COOP_Q4_K,
            s::MATMUL_COOP_Q5_K,
            s::MATMUL_COOP_Q6_K,
        ],
        QOp::MatmulCoopWide => [
            s::MATMUL_COOP_WIDE_F32,
            s::MATMUL_COOP_WIDE_F16,
            s::MATMUL_COOP_WIDE_Q4_0,
            s::MATMUL_COOP_WIDE_Q4_1,
            s::MATMUL_COOP_WIDE_Q5_0,
            s::MATMUL_COOP_WIDE_Q5_1,
            s::MATMUL_COOP_WIDE_Q8_0,
            s::MATMUL_COOP_WIDE_Q4_K,
            s::MATMUL_COOP_WIDE_Q5_K,
            s::MATMUL_COOP_WIDE_Q6_K,
        ],
        QOp::MatmulCoopSmall => [
            s::MATMUL_COOP_SMALL_F32,
            s::MATMUL_COOP_SMALL_F16,
            s::MATMUL_COOP_SMALL_Q4_0,
            s::MATMUL_COOP_SMALL_Q4_1,
            s::MATMUL_COOP_SMALL_Q5_0,
            s::MATMUL_COOP_SMALL_Q5_1,
            s::MATMUL_COOP_SMALL_Q8_0,
            s::MATMUL_COOP_SMALL_Q4_K,
            s::MATMUL_COOP_SMALL_Q5_K,
            s::MATMUL_COOP_SMALL_Q6_K,
        ],
        QOp::MatmulCoopGlu => [
            s::MATMUL_COOP_GLU_F32,
            s::MATMUL_COOP_GLU_F16,
            s::MATMUL_COOP_GLU_Q4_0,
            s::MATMUL_COOP_GLU_Q4_1,
            s::MATMUL_COOP_GLU_Q5_0,
            s::MATMUL_COOP_GLU_Q5_1,
            s::MATMUL_COOP_GLU_Q8_0,
            s::MATMUL_COOP_GLU_Q4_K,
            s::MATMUL_COOP_GLU_Q5_K,
            s::MATMUL_COOP_GLU_Q6_K,
        ],
        QOp::MatmulCoopGluSmall => [
            s::MATMUL_COOP_GLU_SMALL_F32,
            s::MATMUL_COOP_GLU_SMALL_F16,
            s::MATMUL_COOP_GLU_SMALL_Q4_0,
            s::MATMUL_COOP_GLU_SMALL_Q4_1,
            s::MATMUL_COOP_GLU_SMALL_Q5_0,
            s::MATMUL_COOP_GLU_SMALL_Q5_1,
            s::MATMUL_COOP_GLU_SMALL_Q8_0,
            s::MATMUL_COOP_GLU_SMALL_Q4_K,
            s::MATMUL_COOP_GLU_SMALL_Q5_K,
            s::MATMUL_COOP_GLU_SMALL_Q6_K,
        ],
        QOp::GetRows => [
            s::GET_ROWS_F32,
            s::GET_ROWS_F16,
            s::GET_ROWS_Q4_0,
            s::GET_ROWS_Q4_1,
            s::GET_ROWS_Q5_0,
            s::GET_ROWS_Q5_1,
            s::GET_ROWS_Q8_0,
            s::GET_ROWS_Q4_K,
            s::GET_ROWS_Q5_K,
            s::GET_ROWS_Q6_K,
        ],
    };
    table[i]
}

/// The index of `ty` in [`TYPES`], or a shape error naming the op.
pub(crate) fn type_index(op: &'static str, ty: GgmlType) -> Result<usize> {
    TYPES.iter().position(|&t| t == ty).ok_or_else(|| {
        let supported: Vec<String> = TYPES.iter().map(|t| t.to_string()).collect();
        KernelError::Shape {
            op,
            detail: format!(
                "weight type {ty} is not supported (supported: {})",
                supported.join(", ")
            ),
        }
    })
}

/// Bytes of one row of `n_cols` elements of `ty`; an error unless `n_cols` is a positive
/// multiple of the type's block size and the size fits the shaders' 32-bit byte offsets.
pub(crate) fn row_bytes(op: &'static str, ty: GgmlType, n_cols: u32) -> Result<u32> {
    let shape = |detail: String| KernelError::Shape { op, detail };
    if n_cols == 0 {
        return Err(shape(format!("{ty}: n_cols is 0")));
    }
    let bytes = octoflow_gguf::quant::quantized_size(ty, n_cols as usize).map_err(|_| {
        shape(format!(
            "{ty}: n_cols = {n_cols} is not a multiple of the block size {}",
            ty.block_size()
        ))
    })?;
    u32::try_from(bytes).map_err(|_| shape(format!("{ty}: a row of {n_cols} takes {bytes} bytes")))
}

/// Checks that `s` (operand `name`) holds at least `need` bytes and returns it as a binding
/// whose size is a whole number of 32-bit words (the shaders read `uint w[]`; a last partial
/// word would be out of bounds). Extends the range into the buffer when the slice stops
/// mid-word; an error when the buffer itself ends there, or when `need` exceeds 32-bit offsets.
pub(crate) fn word_slice(
    op: &'static str,
    name: &str,
    s: &BufferSlice,
    need: u64,
) -> Result<BufferSlice> {
    let shape = |detail: String| KernelError::Shape { op, detail };
    if need > u64::from(u32::MAX) {
        return Err(shape(format!(
            "{name} needs {need} bytes, over the shaders' 32-bit byte offsets"
        )));
    }
    if s.size < need {
        return Err(shape(format!(
            "{name} ({}) holds {} bytes, needs {need}",
            s.buffer.name(),
            s.size
        )));
    }
    let padded = s.size.next_multiple_of(4);
    if padded == s.size {
        return Ok(s.clone());
    }
    if s.offset + padded > s.buffer.size() {
        return Err(shape(format!(
            "{name} ({}) ends at byte {} mid-word: pad the buffer to a multiple of 4 bytes",
            s.buffer.name(),
            s.offset + s.size
        )));
    }
    Ok(BufferSlice {
        buffer: s.buffer.clone(),
        offset: s.offset,
        size: padded,
    })
}

/// Checks that the operand `name` of 4-byte `unit`s (`floats`, `u32s`) holds at least `count`
/// of them, within the shaders' 32-bit offsets.
pub(crate) fn check_words(
    op: &'static str,
    name: &str,
    s: &BufferSlice,
    count: u64,
    unit: &str,
) -> Result<()> {
    if s.size < 4 * count || 4 * count > u64::from(u32::MAX) {
        return Err(KernelError::Shape {
            op,
            detail: format!(
                "{name} ({}) holds {} bytes, {count} {unit} need {}",
                s.buffer.name(),
                s.size,
                4 * count
            ),
        });
    }
    Ok(())
}
