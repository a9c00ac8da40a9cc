//! Data larger than one buffer may be: split across several buffers, each within the device's
//! `maxMemoryAllocationSize` and `maxStorageBufferRange` (lavapipe binds at most 128 MiB, the
//! H100 allocates at most 4 GiB at once).
//!
//! Two plans: [`split_plan`] cuts one large array into pieces at multiples of a granule (a row,
//! a quant block row) so no row straddles two buffers; [`pack_plan`] places many arrays (the
//! tensors of a model) into as few buffers as fit, none straddling.

use std::ops::Range;

use crate::buffer::{Buffer, BufferSlice, MemoryKind};
use crate::context::Context;
use crate::error::{Result, VkError};
use crate::plain::{as_bytes, as_bytes_mut, Plain};

/// Byte ranges of `total` bytes split into pieces of at most `limit` bytes, each (but the
/// last) a multiple of `granule` bytes.
pub fn split_plan(total: u64, granule: u64, limit: u64) -> Result<Vec<Range<u64>>> {
    if granule == 0 || granule > limit {
        return Err(VkError::BadRange {
            what: "split plan".into(),
            detail: format!("granule {granule} must be in 1..={limit} (the per-buffer limit)"),
        });
    }
    let step = limit - limit % granule;
    let mut ranges = Vec::new();
    let mut start = 0;
    while start < total {
        let end = (start + step).min(total);
        ranges.push(start..end);
        start = end;
    }
    Ok(ranges)
}

/// Where one packed array lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Index of the buffer.
    pub chunk: usize,
    /// Byte offset in that buffer (a multiple of the packing alignment).
    pub offset: u64,
}

/// Places arrays of `sizes` bytes, first fit in order, into buffers of at most `limit` bytes, each array
/// starting at a multiple of `align` (use the device's storage offset alignment). Returns each
/// array's placement and each buffer's size. An array larger than `limit` is an error naming
/// its index (split it with [`split_plan`] first).
pub fn pack_plan(sizes: &[u64], align: u64, limit: u64) -> Result<(Vec<Placement>, Vec<u64>)> {
    let align = align.max(1);
    let mut placements = Vec::with_capacity(sizes.len());
    let mut chunks: Vec<u64> = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        if size > limit {
            return Err(VkError::BufferTooLarge {
                what: format!("packed array #{i}"),
                requested: size,
                limit_name: "per-buffer limit",
                limit,
            });
        }
        // First fit: the first buffer with room after its aligned end.
        let fit = chunks
            .iter()
            .position(|&used| used.div_ceil(align) * align + size <= limit);
        match fit {
            Some(chunk) => {
                let offset = chunks[chunk].div_ceil(align) * align;
                chunks[chunk] = offset + size;
                placements.push(Placement { chunk, offset });
            }
            None => {
                chunks.push(size);
                placements.push(Placement {
                    chunk: chunks.len() - 1,
                    offset: 0,
                });
            }
        }
    }
    // Zero-sized arrays still need a non-empty buffer to bind.
    for c in &mut chunks {
        *c = (*c).max(4);
    }
    Ok((placements, chunks))
}

/// One logical byte array stored in several buffers (see [`split_plan`]).
pub struct ChunkedBuffer {
    chunks: Vec<Buffer>,
    ranges: Vec<Range<u64>>,
    name: String,
}

impl ChunkedBuffer {
    /// Allocates `total` bytes split at multiples of `granule` within the device's limits.
    pub fn new(
        ctx: &Context,
        name: &str,
        total: u64,
        granule: u64,
        kind: MemoryKind,
    ) -> Result<Self> {
        Self::with_limit(
            ctx,
            name,
            total,
            granule,
            ctx.caps().max_buffer_bytes(),
            kind,
        )
    }

    /// Like [`ChunkedBuffer::new`] with a per-buffer `limit` of at most the device's.
    pub fn with_limit(
        ctx: &Context,
        name: &str,
        total: u64,
        granule: u64,
        limit: u64,
        kind: MemoryKind,
    ) -> Result<Self> {
        let limit = limit.min(ctx.caps().max_buffer_bytes());
        let ranges = split_plan(total, granule, limit)?;
        let chunks = ranges
            .iter()
            .enumerate()
            .map(|(i, r)| Buffer::new(ctx, &format!("{name}[{i}]"), r.end - r.start, kind))
            .collect::<Result<Vec<_>>>()?;
        Ok(ChunkedBuffer {
            chunks,
            ranges,
            name: name.into(),
        })
    }

    /// The buffers, in order.
    pub fn chunks(&self) -> &[Buffer] {
        &self.chunks
    }

    /// Logical byte range held by each buffer.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// Total bytes.
    pub fn len(&self) -> u64 {
        self.ranges.last().map_or(0, |r| r.end)
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffer index and offset in it of logical byte `offset`.
    pub fn locate(&self, offset: u64) -> Option<(usize, u64)> {
        let i = self.ranges.partition_point(|r| r.end <= offset);
        self.ranges.get(i).map(|r| (i, offset - r.start))
    }

    /// A binding of `size` logical bytes from `offset`; they must lie in one buffer.
    pub fn slice(&self, offset: u64, size: u64) -> Result<BufferSlice> {
        let (i, local) = self
            .locate(offset)
            .ok_or_else(|| self.range_error(offset, size))?;
        self.chunks[i]
            .slice(local, size)
            .map_err(|_| self.range_error(offset, size))
    }

    /// Copies `data` to logical byte `offset`, across buffer boundaries as needed.
    pub fn upload<T: Plain>(&self, ctx: &Context, offset: u64, data: &[T]) -> Result<()> {
        let bytes = as_bytes(data);
        self.for_pieces(offset, bytes.len() as u64, |buf, local, at, len| {
            ctx.upload(buf, local, &bytes[at..at + len])
        })
    }

    /// Copies logical bytes from `offset` into `out`, across buffer boundaries as needed.
    pub fn download<T: Plain>(&self, ctx: &Context, offset: u64, out: &mut [T]) -> Result<()> {
        let bytes = as_bytes_mut(out);
        self.for_pieces(offset, bytes.len() as u64, |buf, local, at, len| {
            ctx.download(buf, local, &mut bytes[at..at + len])
        })
    }

    /// Calls `f(buffer, offset in buffer, offset in data, length)` for each piece of the
    /// logical range `offset..offset + len`.
    fn for_pieces(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(&Buffer, u64, usize, usize) -> Result<()>,
    ) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(self.range_error(offset, len));
        }
        let mut done = 0u64;
        while done < len {
            let (i, local) = self
                .locate(offset + done)
                .ok_or_else(|| self.range_error(offset, len))?;
            let piece = (self.ranges[i].end - self.ranges[i].start - local).min(len - done);
            f(&self.chunks[i], local, done as usize, piece as usize)?;
            done += piece;
        }
        Ok(())
    }

    fn range_error(&self, offset: u64, size: u64) -> VkError {
        VkError::BadRange {
            what: self.name.clone(),
            detail: format!(
                "range {offset}+{size} is not inside one of its {} buffers ({} bytes)",
                self.chunks.len(),
                self.len()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_cuts_at_granule_multiples_within_the_limit() {
        let r = split_plan(1000, 30, 100).unwrap();
        assert_eq!(r.first(), Some(&(0..90)));
        assert!(r
            .iter()
            .all(|x| x.end - x.start <= 100 && x.start % 30 == 0));
        assert_eq!(r.last().map(|x| x.end), Some(1000));
        assert_eq!(r.len(), 12);
    }

    #[test]
    fn split_rejects_a_granule_larger_than_the_limit() {
        assert!(split_plan(10, 200, 100).is_err());
        assert!(split_plan(10, 0, 100).is_err());
    }

    #[test]
    fn pack_places_first_fit_with_aligned_offsets() {
        let (p, chunks) = pack_plan(&[60, 10, 30, 90, 5], 16, 100).unwrap();
        assert_eq!(
            p[0],
            Placement {
                chunk: 0,
                offset: 0
            }
        );
        assert_eq!(
            p[1],
            Placement {
                chunk: 0,
                offset: 64
            }
        );
        assert_eq!(
            p[2],
            Placement {
                chunk: 1,
                offset: 0
            }
        );
        assert_eq!(
            p[3],
            Placement {
                chunk: 2,
                offset: 0
            }
        );
        assert_eq!(
            p[4],
            Placement {
                chunk: 0,
                offset: 80
            }
        );
        assert_eq!(chunks, vec![85, 30, 90]);
    }

    #[test]
    fn pack_names_the_array_that_cannot_fit() {
        let err = pack_plan(&[10, 500], 16, 100).unwrap_err();
        assert!(err.to_string().contains("#1"), "{err}");
    }
}
