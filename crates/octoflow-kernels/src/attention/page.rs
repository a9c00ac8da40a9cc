//! Paged KV caches: the host side of `shaders/attention/page.glsl`.
//!
//! In position-table mode ([`crate::Positions::Table`]) a sequence's keys and values live in
//! blocks of [`KV_PAGE`] cache rows anywhere in the cache buffers. Its block table is a run of
//! u32 block ids in the `pos` buffer, and each token's second table word says where the table
//! of its sequence starts, so position `j` of the sequence is cache row
//! `table[j / KV_PAGE] * KV_PAGE + j % KV_PAGE`. Sequences may name the same block (a shared
//! prefix); the kernels only read and write the rows the tables name.

/// Rows of one KV block (`KV_PAGE` in page.glsl).
pub const KV_PAGE: u32 = 16;

/// Blocks that hold `positions` positions.
pub fn blocks_for(positions: usize) -> usize {
    positions.div_ceil(KV_PAGE as usize)
}

/// The cache row of position `j` of the sequence whose block table is `table`, or `None` when
/// the table does not reach `j` (what the shaders treat as a row that is neither read nor
/// written).
pub fn page_row(table: &[u32], j: usize) -> Option<usize> {
    let page = KV_PAGE as usize;
    table.get(j / page).map(|&b| b as usize * page + j % page)
}

/// Random block tables for tests: `n_seq` sequences of `seq_rows` positions each in a pool of
/// shuffled blocks (with spare blocks nobody owns), so that a kernel reading a sequence's rows
/// as if they were contiguous fails.
#[cfg(test)]
pub(crate) struct Paged {
    /// Each sequence's block ids.
    pub tables: Vec<Vec<u32>>,
    /// Rows of the pool (a whole number of blocks).
    pub pool_rows: usize,
}

#[cfg(test)]
impl Paged {
    pub fn random(rng: &mut impl rand::Rng, n_seq: usize, seq_rows: usize) -> Self {
        use rand::seq::SliceRandom;
        let nb = blocks_for(seq_rows);
        let n_blocks = n_seq * nb + 3;
        let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
        ids.shuffle(rng);
        Paged {
            tables: ids
                .chunks(nb.max(1))
                .take(n_seq)
                .map(<[u32]>::to_vec)
                .collect(),
            pool_rows: n_blocks * KV_PAGE as usize,
        }
    }

    /// The pool row of position `j` of sequence `seq`.
    pub fn row(&self, seq: usize, j: usize) -> usize {
        page_row(&self.tables[seq], j).expect("position within the sequence's blocks")
    }

    /// Rows `0..n` of sequence `seq` gathered from a pool `[pool_rows, width]`.
    pub fn gather(&self, pool: &[f32], width: usize, seq: usize, n: usize) -> Vec<f32> {
        (0..n)
            .flat_map(|j| {
                let r = self.row(seq, j);
                pool[r * width..(r + 1) * width].iter().copied()
            })
            .collect()
    }

    /// Appends the block tables to `words` (a `pos` buffer); returns where each starts.
    pub fn append_to(&self, words: &mut Vec<u32>) -> Vec<u32> {
        self.tables
            .iter()
            .map(|t| {
                let at = words.len() as u32;
                words.extend(t);
                at
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_follow_the_block_table() {
        let t = [5u32, 0, 2];
        assert_eq!(page_row(&t, 0), Some(80));
        assert_eq!(page_row(&t, 15), Some(95));
        assert_eq!(page_row(&t, 16), Some(0));
        assert_eq!(page_row(&t, 33), Some(33));
        assert_eq!(page_row(&t, 48), None);
        assert_eq!(blocks_for(0), 0);
        assert_eq!(blocks_for(16), 1);
        assert_eq!(blocks_for(17), 2);
    }
}
