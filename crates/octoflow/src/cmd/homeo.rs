//! The homeostasis flags of `serve`, `agents`, `train` and `bench` (`--temp-target`,
//! `--power-target`, `--sensor-log`), and the pacer they start for the device in use
//! (docs/HOMEOSTASIS.md).

use std::path::PathBuf;

use anyhow::bail;
use octoflow_homeo::{DeviceMatch, Pacer, PacerOptions, Targets};

/// Thermal and power pacing.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct HomeoArgs {
    /// Hold the GPU's temperature at or below this many °C by inserting idle time between
    /// submits (the device's own settings are never changed).
    #[arg(long, value_name = "C")]
    pub temp_target: Option<f64>,
    /// Hold the GPU's board power at or below this many W by inserting idle time between
    /// submits (no power-limit write, no clock lock).
    #[arg(long, value_name = "W")]
    pub power_target: Option<f64>,
    /// Write every sensor sample (10 Hz) to this CSV: t_s, temp_c, power_w, energy_j,
    /// clock_mhz, idle_fraction, delay_s, unix_s.
    #[arg(long, value_name = "FILE")]
    pub sensor_log: Option<PathBuf>,
}

impl HomeoArgs {
    /// The targets, checked.
    pub fn targets(&self) -> anyhow::Result<Targets> {
        for (flag, v, lo, hi) in [
            ("--temp-target", self.temp_target, 20.0, 120.0),
            ("--power-target", self.power_target, 1.0, 5000.0),
        ] {
            if let Some(v) = v {
                if !(lo..=hi).contains(&v) {
                    bail!("{flag} {v}: expected a value between {lo} and {hi}");
                }
            }
        }
        Ok(Targets {
            temp_c: self.temp_target,
            power_w: self.power_target,
        })
    }

    /// The pacer of the Vulkan device `caps` (the GPU path) or of none (`None`: the CPU
    /// reference). Without a sensor: one notice on stderr and [`Pacer::off`]; a target then
    /// paces nothing. `who` prefixes the notice (`octoflow serve`).
    pub fn start(
        &self,
        caps: Option<&octoflow_vk::DeviceCaps>,
        who: &str,
    ) -> anyhow::Result<Pacer> {
        let targets = self.targets()?;
        let sensor = match caps {
            Some(c) => octoflow_homeo::open(&DeviceMatch {
                vendor_id: c.vendor_id,
                pci_bus: c.pci_bus.clone(),
                uuid: c.device_uuid.clone(),
            }),
            None => Err("no sensor: the CPU reference has no GPU to read".into()),
        };
        let sensor = match sensor {
            Ok(s) => s,
            Err(notice) => {
                let off = if targets.any() { "; pacing off" } else { "" };
                eprintln!("{who}: {notice}{off}");
                return Ok(Pacer::off());
            }
        };
        let name = sensor.name();
        let pacer = Pacer::start(
            sensor,
            PacerOptions {
                targets,
                log: self.sensor_log.clone(),
                ..Default::default()
            },
        )
        .map_err(|e| {
            anyhow::anyhow!(
                "starting the sensor sampler{}: {e}",
                self.sensor_log.as_ref().map_or(String::new(), |p| format!(
                    " (--sensor-log {})",
                    p.display()
                ))
            )
        })?;
        if targets.any() {
            eprintln!("{who}: pacing to {targets} ({name})");
        }
        Ok(pacer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_targets_are_clear_errors() {
        let bad = HomeoArgs {
            power_target: Some(-5.0),
            ..Default::default()
        };
        let e = bad.targets().expect_err("negative watts").to_string();
        assert!(e.contains("--power-target"), "{e}");
        let nan = HomeoArgs {
            temp_target: Some(f64::NAN),
            ..Default::default()
        };
        assert!(nan.targets().is_err());
    }

    #[test]
    fn no_gpu_means_pacing_off_not_failure() {
        let args = HomeoArgs {
            power_target: Some(200.0),
            ..Default::default()
        };
        let pacer = args.start(None, "test").expect("a notice, not an error");
        assert!(!pacer.has_sensor());
        pacer.before_submit();
    }
}
