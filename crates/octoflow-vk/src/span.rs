//! The GPU time of a whole chain: two timestamps, one when the chain starts and one when its
//! last command is done — what "GPU busy" figures are made of (the sum of the chains' spans
//! over the wall time), at the cost of two queries instead of one per dispatch.

use ash::vk;

use crate::chain::{Chain, State};
use crate::error::{vk_err, Result, VkError};

/// A chain's two-query pool.
pub(crate) struct SpanTimer {
    device: ash::Device,
    pool: vk::QueryPool,
    period_ns: f64,
    /// Mask of the valid timestamp bits (differences wrap within it).
    mask: u64,
}

impl SpanTimer {
    /// Creates the pool and records its reset and the opening timestamp into `cmd`.
    pub(crate) fn start(
        device: &ash::Device,
        cmd: vk::CommandBuffer,
        period_ns: f32,
        valid_bits: u32,
    ) -> Result<Self> {
        let info = vk::QueryPoolCreateInfo::default()
            .query_type(vk::QueryType::TIMESTAMP)
            .query_count(2);
        // SAFETY: valid create info on a live device.
        let pool = unsafe { device.create_query_pool(&info, None) }
            .map_err(vk_err("vkCreateQueryPool"))?;
        // SAFETY: recording into `cmd`; the reset precedes the write in the same buffer, so
        // every replay resets the queries first.
        unsafe {
            device.cmd_reset_query_pool(cmd, pool, 0, 2);
            device.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, pool, 0);
        }
        let mask = if valid_bits >= 64 {
            u64::MAX
        } else {
            (1u64 << valid_bits) - 1
        };
        Ok(SpanTimer {
            device: device.clone(),
            pool,
            period_ns: f64::from(period_ns),
            mask,
        })
    }

    /// Records the closing timestamp (after every earlier command).
    pub(crate) fn close(&self, cmd: vk::CommandBuffer) {
        // SAFETY: recording into `cmd`; query 1 was reset at the start of the same buffer.
        unsafe {
            self.device.cmd_write_timestamp(
                cmd,
                vk::PipelineStageFlags::BOTTOM_OF_PIPE,
                self.pool,
                1,
            )
        };
    }

    /// Nanoseconds between the two timestamps of the last completed submit.
    fn read(&self) -> Result<f64> {
        let mut t = [0u64; 2];
        // SAFETY: the chain's fence was waited on, so both queries are available.
        unsafe {
            self.device.get_query_pool_results(
                self.pool,
                0,
                &mut t,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
        }
        .map_err(vk_err("vkGetQueryPoolResults"))?;
        Ok((t[1].wrapping_sub(t[0]) & self.mask) as f64 * self.period_ns)
    }
}

impl Drop for SpanTimer {
    fn drop(&mut self) {
        // SAFETY: the owning chain waited for its last submit before dropping this.
        unsafe { self.device.destroy_query_pool(self.pool, None) };
    }
}

impl Chain {
    /// Starts recording a chain whose whole GPU time each submit takes is measured
    /// ([`Chain::span_ns`]). Errors on a device without compute-queue timestamps.
    pub fn with_span_timing(ctx: &crate::Context) -> Result<Self> {
        let caps = ctx.caps();
        if !caps.timestamps {
            return Err(VkError::NoTimestamps {
                device: caps.name.clone(),
            });
        }
        let mut chain = Chain::new(ctx)?;
        chain.span = Some(SpanTimer::start(
            &ctx.inner.device,
            chain.cmd,
            caps.timestamp_period_ns,
            caps.timestamp_bits,
        )?);
        Ok(chain)
    }

    /// The GPU time of the last completed submit in nanoseconds, from its first command's
    /// start to its last one's end; `None` for a chain made without span timing.
    pub fn span_ns(&mut self) -> Result<Option<f64>> {
        if self.state == State::Recording {
            return Err(VkError::BadDispatch {
                pipeline: "chain".into(),
                detail: "span read before the chain ran".into(),
            });
        }
        self.wait()?;
        self.span.as_ref().map(SpanTimer::read).transpose()
    }
}
