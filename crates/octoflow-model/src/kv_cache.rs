//! The KV cache of one sequence: per layer, the keys and values of every processed position.

/// Keys and values of one sequence, f32.
///
/// Layer `l` holds `k[l]`: `[n_pos, k_dim]` and `v[l]`: `[n_pos, v_dim]`, row-major, where row
/// `p` belongs to position `p` (keys after RoPE). Memory grows with the positions in use, up to
/// `n_ctx`.
#[derive(Debug, Clone)]
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    k_dim: usize,
    v_dim: usize,
    n_ctx: usize,
    /// Positions whose keys and values are valid in every layer.
    len: usize,
}

impl KvCache {
    /// An empty cache for `n_layer` layers and at most `n_ctx` positions.
    pub fn new(n_layer: usize, k_dim: usize, v_dim: usize, n_ctx: usize) -> Self {
        Self {
            k: vec![Vec::new(); n_layer],
            v: vec![Vec::new(); n_layer],
            k_dim,
            v_dim,
            n_ctx,
            len: 0,
        }
    }

    /// Positions cached in every layer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most positions this cache may hold.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Forgets positions `len..` (for re-running from an earlier position).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Writes the keys (`[n, k_dim]`) and values (`[n, v_dim]`) of positions
    /// `start..start + n` of layer `il`, dropping anything cached at or after `start`.
    /// `start` must not exceed [`Self::len`].
    pub(crate) fn store(&mut self, il: usize, start: usize, k: &[f32], v: &[f32]) {
        debug_assert!(start <= self.len);
        let kl = &mut self.k[il];
        kl.truncate(start * self.k_dim);
        kl.extend_from_slice(k);
        let vl = &mut self.v[il];
        vl.truncate(start * self.v_dim);
        vl.extend_from_slice(v);
    }

    /// Marks positions `..len` valid in every layer (after a whole forward pass stored them).
    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len;
    }

    /// Keys of layer `il` for positions `0..n`, `[n, k_dim]`.
    pub fn keys(&self, il: usize, n: usize) -> &[f32] {
        &self.k[il][..n * self.k_dim]
    }

    /// Values of layer `il` for positions `0..n`, `[n, v_dim]`.
    pub fn values(&self, il: usize, n: usize) -> &[f32] {
        &self.v[il][..n * self.v_dim]
    }
}
