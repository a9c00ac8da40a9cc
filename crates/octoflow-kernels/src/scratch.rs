//! Device scratch a kernel keeps between dispatches (split-K partial sums, the decode attention's
//! arrival counters), one buffer per queue:
//! dispatches recorded for one queue share it (the caller's barriers order them, and submissions
//! to one queue are ordered by those barriers); chains on different queues may run at once, so
//! each queue gets its own. A chain's queue must be set before it is recorded.

use std::sync::Mutex;

use octoflow_vk::{Buffer, BufferSlice, Chain, MemoryKind};

use crate::error::Result;

/// Per-queue scratch buffers, grown on need.
pub(crate) struct QueueScratch {
    name: &'static str,
    /// New buffers are filled with zeros (counters that the kernel returns to zero itself).
    zeroed: bool,
    bufs: Mutex<Vec<Option<Buffer>>>,
}

impl QueueScratch {
    /// No buffer yet; `name` labels the buffers.
    pub(crate) fn new(name: &'static str) -> Self {
        Self {
            name,
            zeroed: false,
            bufs: Mutex::new(Vec::new()),
        }
    }

    /// Buffers that start as zeros: counters a kernel puts back to zero itself when it is done
    /// with them (the "last workgroup merges" pattern), so replayed chains find them at zero.
    pub(crate) fn zeroed(name: &'static str) -> Self {
        Self {
            zeroed: true,
            ..Self::new(name)
        }
    }

    /// `bytes` (rounded up to 16) of scratch for `chain`'s queue: the region the chain lends
    /// ([`Chain::lend_scratch`]: an idle activation buffer) when it is large enough and these
    /// buffers need not start as zeros, else the start of [`QueueScratch::get`]'s buffer.
    pub(crate) fn get_slice(&self, chain: &Chain, bytes: u64) -> Result<BufferSlice> {
        let bytes = bytes.next_multiple_of(16);
        if !self.zeroed {
            if let Some(lent) = chain.lent_scratch().filter(|l| l.size >= bytes) {
                return Ok(lent.buffer.slice(lent.offset, bytes)?);
            }
        }
        Ok(self.get(chain, bytes)?.slice(0, bytes)?)
    }

    /// A buffer of at least `bytes` for `chain`'s queue (a larger one replaces a smaller one;
    /// chains recorded earlier keep theirs alive).
    pub(crate) fn get(&self, chain: &Chain, bytes: u64) -> Result<Buffer> {
        let mut all = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        let q = chain.queue();
        if all.len() <= q {
            all.resize(q + 1, None);
        }
        match all[q].as_ref() {
            Some(b) if b.size() >= bytes => Ok(b.clone()),
            _ => {
                // what is asked (whole 64 KiB): the first chain recorded is usually the largest
                // (a prompt's prefill), later ones reuse its buffer
                let size = bytes.next_multiple_of(1 << 16);
                let b = Buffer::new(chain.context(), self.name, size, MemoryKind::DeviceLocal)?;
                if self.zeroed {
                    chain.context().fill(&b, 0, size, 0)?;
                }
                all[q] = Some(b.clone());
                Ok(b)
            }
        }
    }
}
