//! Element types that may be copied to and from GPU buffers as raw bytes.

mod sealed {
    pub trait Sealed {}
}

/// A plain-old-data element: no padding, every bit pattern valid. Implemented for the integer
/// and float types (including `half::f16`/`bf16`) our buffers hold.
pub trait Plain: sealed::Sealed + Copy + Default + 'static {}

macro_rules! plain {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Plain for $t {}
    )*};
}
plain!(
    u8,
    i8,
    u16,
    i16,
    u32,
    i32,
    u64,
    i64,
    f32,
    f64,
    half::f16,
    half::bf16
);

/// Views a slice of plain elements as bytes.
pub fn as_bytes<T: Plain>(data: &[T]) -> &[u8] {
    // SAFETY: `Plain` types have no padding and alignment 1 suffices for u8.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

/// Views a mutable slice of plain elements as bytes; any bytes written are valid elements.
pub fn as_bytes_mut<T: Plain>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: `Plain` types accept every bit pattern and have no padding.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), std::mem::size_of_val(data)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_little_endian_elements() {
        let v = [1.0f32, -2.5];
        let b = as_bytes(&v);
        assert_eq!(b.len(), 8);
        assert_eq!(&b[4..], &(-2.5f32).to_le_bytes());
        let mut w = [0u32; 2];
        as_bytes_mut(&mut w).copy_from_slice(b);
        assert_eq!(w[0], 1.0f32.to_bits());
    }
}
