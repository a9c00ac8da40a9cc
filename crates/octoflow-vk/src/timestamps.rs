//! GPU timestamps around a chain's dispatches, for `--profile`.

use ash::vk;

use crate::error::{vk_err, Result};

const QUERIES_PER_POOL: u32 = 1024;

/// GPU time of one dispatch: from the end of the previous one (or the chain's start) to its end.
#[derive(Debug, Clone, PartialEq)]
pub struct DispatchTime {
    /// The pipeline's label, prefixed by the chain's scope (`layer3/matvec_q4_0`) if one is set.
    pub label: String,
    /// Nanoseconds.
    pub ns: f64,
}

/// Total GPU time of every dispatch with one label.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelTime {
    pub label: String,
    /// Dispatches with this label.
    pub count: usize,
    /// Nanoseconds, summed.
    pub total_ns: f64,
}

/// Sums `times` per label, largest total first.
pub fn summarize(times: &[DispatchTime]) -> Vec<LabelTime> {
    let mut out: Vec<LabelTime> = Vec::new();
    for t in times {
        match out.iter_mut().find(|l| l.label == t.label) {
            Some(l) => {
                l.count += 1;
                l.total_ns += t.ns;
            }
            None => out.push(LabelTime {
                label: t.label.clone(),
                count: 1,
                total_ns: t.ns,
            }),
        }
    }
    out.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
    out
}

/// Query pools of a chain: query 0 is the start, query i+1 follows dispatch i.
pub(crate) struct Timestamps {
    device: ash::Device,
    pools: Vec<vk::QueryPool>,
    written: u32,
    labels: Vec<String>,
    period_ns: f64,
    /// Mask of the valid timestamp bits (differences wrap within it).
    mask: u64,
}

impl Timestamps {
    pub(crate) fn new(device: &ash::Device, period_ns: f32, valid_bits: u32) -> Self {
        let mask = if valid_bits >= 64 {
            u64::MAX
        } else {
            (1u64 << valid_bits) - 1
        };
        Timestamps {
            device: device.clone(),
            pools: Vec::new(),
            written: 0,
            labels: Vec::new(),
            period_ns: f64::from(period_ns),
            mask,
        }
    }

    /// Records a timestamp after all previous work; `label` names the dispatch it closes
    /// (`None` for the opening one).
    pub(crate) fn write(&mut self, cmd: vk::CommandBuffer, label: Option<String>) -> Result<()> {
        let slot = self.written % QUERIES_PER_POOL;
        if slot == 0 {
            let info = vk::QueryPoolCreateInfo::default()
                .query_type(vk::QueryType::TIMESTAMP)
                .query_count(QUERIES_PER_POOL);
            // SAFETY: valid create info; the reset is recorded before any write into the pool,
            // so every replay of the command buffer resets it again first.
            let pool = unsafe { self.device.create_query_pool(&info, None) }
                .map_err(vk_err("vkCreateQueryPool"))?;
            self.pools.push(pool);
            unsafe {
                self.device
                    .cmd_reset_query_pool(cmd, pool, 0, QUERIES_PER_POOL)
            };
        }
        let pool = self.pools[self.pools.len() - 1];
        // SAFETY: recording into `cmd`; the query was reset above in this command buffer.
        unsafe {
            self.device
                .cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, pool, slot)
        };
        self.written += 1;
        if let Some(label) = label {
            self.labels.push(label);
        }
        Ok(())
    }

    /// Whether the opening timestamp is recorded.
    pub(crate) fn started(&self) -> bool {
        self.written > 0
    }

    /// Reads the times of the last completed submit.
    pub(crate) fn read(&self) -> Result<Vec<DispatchTime>> {
        let mut ticks = Vec::with_capacity(self.written as usize);
        for (i, &pool) in self.pools.iter().enumerate() {
            let count = (self.written - i as u32 * QUERIES_PER_POOL).min(QUERIES_PER_POOL);
            let mut out = vec![0u64; count as usize];
            // SAFETY: the chain's fence was waited on, so these queries are available.
            unsafe {
                self.device.get_query_pool_results(
                    pool,
                    0,
                    &mut out,
                    vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
                )
            }
            .map_err(vk_err("vkGetQueryPoolResults"))?;
            ticks.extend(out);
        }
        Ok(self
            .labels
            .iter()
            .enumerate()
            .map(|(i, label)| DispatchTime {
                label: label.clone(),
                ns: (ticks[i + 1].wrapping_sub(ticks[i]) & self.mask) as f64 * self.period_ns,
            })
            .collect())
    }
}

impl Drop for Timestamps {
    fn drop(&mut self) {
        // SAFETY: the owning chain waited for its last submit.
        unsafe {
            for &pool in &self.pools {
                self.device.destroy_query_pool(pool, None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_groups_by_label_largest_first() {
        let t = |label: &str, ns| DispatchTime {
            label: label.into(),
            ns,
        };
        let s = summarize(&[t("a", 1.0), t("b", 5.0), t("a", 2.0)]);
        assert_eq!(
            s[0],
            LabelTime {
                label: "b".into(),
                count: 1,
                total_ns: 5.0
            }
        );
        assert_eq!(
            s[1],
            LabelTime {
                label: "a".into(),
                count: 2,
                total_ns: 3.0
            }
        );
    }
}
