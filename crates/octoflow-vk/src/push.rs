//! Push-constant blocks built field by field (std430 scalar layout: 4-byte fields in order).

/// Bytes of a push-constant block. `Push::new().u32(n).f32(eps)` matches
/// `layout(push_constant) uniform P { uint n; float eps; }`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Push(Vec<u8>);

impl Push {
    /// An empty block.
    pub fn new() -> Self {
        Push(Vec::new())
    }

    /// Appends a `uint`.
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }

    /// Appends an `int`.
    pub fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }

    /// Appends a `float`.
    pub fn f32(mut self, v: f32) -> Self {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::Deref for Push {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}
