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
    /// What the recording said the dispatch moves and computes ([`crate::Chain::set_cost`]);
    /// zero where it said nothing.
    pub cost: Cost,
}

/// Bytes a dispatch must move through memory and floating-point operations it must do, as
/// its kernel reckons them (for the floors of `--profile`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    pub bytes: u64,
    pub flops: u64,
}

impl Cost {
    /// The shortest time, in nanoseconds, at `bytes_per_s` and `flops_per_s`; `None` when
    /// nothing is known.
    pub fn floor_ns(&self, bytes_per_s: f64, flops_per_s: f64) -> Option<f64> {
        if self.bytes == 0 && self.flops == 0 {
            return None;
        }
        let b = self.bytes as f64 / bytes_per_s;
        let f = self.flops as f64 / flops_per_s;
        Some(b.max(f) * 1e9)
    }
}

/// Total GPU time of every dispatch with one label.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelTime {
    pub label: String,
    /// Dispatches with this label.
    pub count: usize,
    /// Nanoseconds, summed.
    pub total_ns: f64,
    /// The floor of every dispatch with this label, summed (nanoseconds, at the rates given to
    /// [`summarize`]); `None` when some dispatch of the label has no cost.
    pub floor_ns: Option<f64>,
}

/// The memory bandwidth and matrix rate floors are computed at by default: an H100's HBM3
/// (~3.0 TB/s reached by streaming kernels) and the ~500 TFLOP/s of f16 cooperative-matrix
/// products that `coopmat_probe` measures there.
pub const FLOOR_RATES: (f64, f64) = (3.0e12, 5.0e14);

/// Sums `times` per label, largest total first, with their floors at `rates` (bytes/s,
/// flops/s; [`FLOOR_RATES`]).
pub fn summarize_at(times: &[DispatchTime], rates: (f64, f64)) -> Vec<LabelTime> {
    let mut out: Vec<LabelTime> = Vec::new();
    for t in times {
        let floor = t.cost.floor_ns(rates.0, rates.1);
        match out.iter_mut().find(|l| l.label == t.label) {
            Some(l) => {
                l.count += 1;
                l.total_ns += t.ns;
                l.floor_ns = l.floor_ns.zip(floor).map(|(a, b)| a + b);
            }
            None => out.push(LabelTime {
                label: t.label.clone(),
                count: 1,
                total_ns: t.ns,
                floor_ns: floor,
            }),
        }
    }
    out.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
    out
}

/// [`summarize_at`] at [`FLOOR_RATES`].
pub fn summarize(times: &[DispatchTime]) -> Vec<LabelTime> {
    summarize_at(times, FLOOR_RATES)
}

/// Query pools of a chain: query 0 is the start, query i+1 follows dispatch i.
pub(crate) struct Timestamps {
    device: ash::Device,
    pools: Vec<vk::QueryPool>,
    written: u32,
    labels: Vec<String>,
    /// The cost of each labelled dispatch (parallel to `labels`).
    costs: Vec<Cost>,
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
            costs: Vec::new(),
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
            self.costs.push(Cost::default());
        }
        Ok(())
    }

    /// Sets the cost of the last labelled dispatch (none yet: ignored).
    pub(crate) fn set_last_cost(&mut self, cost: Cost) {
        if let Some(c) = self.costs.last_mut() {
            *c = cost;
        }
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
                cost: self.costs[i],
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
            cost: Cost::default(),
        };
        let s = summarize(&[t("a", 1.0), t("b", 5.0), t("a", 2.0)]);
        assert_eq!(
            s[0],
            LabelTime {
                label: "b".into(),
                count: 1,
                total_ns: 5.0,
                floor_ns: None,
            }
        );
        assert_eq!(
            s[1],
            LabelTime {
                label: "a".into(),
                count: 2,
                total_ns: 3.0,
                floor_ns: None,
            }
        );
    }

    #[test]
    fn floors_take_the_longer_of_bytes_and_flops_and_need_every_dispatch_costed() {
        let t = |label: &str, bytes, flops| DispatchTime {
            label: label.into(),
            ns: 100.0,
            cost: Cost { bytes, flops },
        };
        // 1 GB/s and 1 GFLOP/s: a byte or a flop is a nanosecond
        let s = summarize_at(
            &[
                t("mv", 50, 10),
                t("mv", 20, 30),
                t("mixed", 5, 0),
                t("mixed", 0, 0),
            ],
            (1e9, 1e9),
        );
        let mv = s.iter().find(|l| l.label == "mv").unwrap();
        assert_eq!(mv.floor_ns, Some(80.0));
        let mixed = s.iter().find(|l| l.label == "mixed").unwrap();
        assert_eq!(mixed.floor_ns, None);
    }
}
