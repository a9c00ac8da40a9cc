//! Host-signalled timeline semaphores: a chain submitted with [`Chain::submit_after`] starts
//! only once the host has called [`Timeline::signal`] with the value it waits for. The host can
//! thus submit work whose last part needs data it does not have yet (a grammar's token mask),
//! let the GPU run the rest meanwhile, and release the tail by writing the data and signalling.
//!
//! A wait that would never end is an error, not a hang: [`Chain::wait`] refuses to wait for a
//! chain whose value has not been signalled, and a chain dropped in that state signals it
//! first, so the queue drains.

use std::sync::Arc;

use ash::vk;

use crate::chain::{Chain, State};
use crate::context::{Context, DeviceInner};
use crate::error::{vk_err, Result, VkError};

struct Inner {
    semaphore: vk::Semaphore,
    /// Last field: the device outlives the semaphore.
    dev: Arc<DeviceInner>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: every chain waiting on it holds a clone of this Arc, so none is pending.
        unsafe { self.dev.device.destroy_semaphore(self.semaphore, None) };
    }
}

/// A timeline semaphore the host signals (values only grow). Clones share the semaphore.
#[derive(Clone)]
pub struct Timeline {
    inner: Arc<Inner>,
}

impl Timeline {
    /// A timeline at value 0. Errors on a device without timeline semaphores.
    pub fn new(ctx: &Context) -> Result<Self> {
        if !ctx.caps().timeline_semaphore {
            return Err(VkError::Unsupported {
                device: ctx.caps().name.clone(),
                reason: "no timeline semaphores".into(),
            });
        }
        let mut kind = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut kind);
        // SAFETY: valid create info on a live device with the timeline feature enabled.
        let semaphore = unsafe { ctx.inner.device.create_semaphore(&info, None) }
            .map_err(vk_err("vkCreateSemaphore"))?;
        Ok(Timeline {
            inner: Arc::new(Inner {
                semaphore,
                dev: ctx.inner.clone(),
            }),
        })
    }

    /// The value the semaphore has reached.
    pub fn value(&self) -> Result<u64> {
        let d = &self.inner.dev.device;
        // SAFETY: the semaphore is a live timeline semaphore of this device.
        unsafe { d.get_semaphore_counter_value(self.inner.semaphore) }
            .map_err(vk_err("vkGetSemaphoreCounterValue"))
    }

    /// Sets the semaphore to `value` from the host, releasing the chains waiting for it or
    /// less. Host writes to mapped memory made before this call are seen by those chains.
    /// `value` must exceed the current one.
    pub fn signal(&self, value: u64) -> Result<()> {
        let now = self.value()?;
        if value <= now {
            return Err(VkError::BadDispatch {
                pipeline: "timeline".into(),
                detail: format!("signal {value} does not exceed the current value {now}"),
            });
        }
        let info = vk::SemaphoreSignalInfo::default()
            .semaphore(self.inner.semaphore)
            .value(value);
        // SAFETY: a live timeline semaphore; the value only grows (checked above, and only the
        // host signals these semaphores).
        unsafe { self.inner.dev.device.signal_semaphore(&info) }
            .map_err(vk_err("vkSignalSemaphore"))
    }

    pub(crate) fn raw(&self) -> vk::Semaphore {
        self.inner.semaphore
    }
}

impl Chain {
    /// [`Chain::submit`], except that the chain's commands start only once `timeline` reaches
    /// `value` ([`Timeline::signal`]). Earlier chains on the same queue are not held back.
    pub fn submit_after(&mut self, timeline: &Timeline, value: u64) -> Result<()> {
        self.submit_waiting(Some((timeline.clone(), value)))
    }

    /// The host signal a pending chain still waits for (`None`: none, or given).
    pub(crate) fn owed_signal(&self) -> Result<Option<(Timeline, u64)>> {
        match (&self.waits_for, self.state) {
            (Some((t, v)), State::Pending) if t.value()? < *v => Ok(Some((t.clone(), *v))),
            _ => Ok(None),
        }
    }
}
