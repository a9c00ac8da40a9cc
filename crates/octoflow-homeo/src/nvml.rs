//! NVIDIA GPUs through NVML. `libnvidia-ml.so` is opened when [`NvmlSensor::open`] runs (the
//! `nvml-wrapper` crate loads it with `libloading`), so the binary builds and runs where the
//! driver is absent: there the open is a notice.

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::Nvml;

use crate::sensor::{normalize_pci, normalize_uuid, DeviceMatch, Reading, Sensor, SensorError};

/// One NVML device, matched to the Vulkan device by PCI address or UUID.
pub struct NvmlSensor {
    nvml: Nvml,
    index: u32,
    name: String,
    /// Whether the device reports an energy counter (Volta and later); probed once at open.
    has_energy: bool,
}

impl NvmlSensor {
    /// The NVML device matching `dev`, or a one-line notice why there is none.
    pub fn open(dev: &DeviceMatch) -> Result<Self, String> {
        let nvml = Nvml::init().map_err(|e| format!("no sensor: NVML not available ({e})"))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("no sensor: NVML device count: {e}"))?;
        let want_pci = dev.pci_bus.as_deref().and_then(normalize_pci);
        let want_uuid = dev.uuid.as_deref().map(normalize_uuid);
        let mut chosen = None;
        for index in 0..count {
            let Ok(d) = nvml.device_by_index(index) else {
                continue;
            };
            let pci = d.pci_info().ok().and_then(|p| normalize_pci(&p.bus_id));
            let uuid = d.uuid().ok().map(|u| normalize_uuid(&u));
            let matches = (want_pci.is_some() && pci == want_pci)
                || (want_uuid.is_some() && uuid == want_uuid);
            // Without anything to match on, a machine with one GPU still has an answer.
            let only_one = want_pci.is_none() && want_uuid.is_none() && count == 1;
            if matches || only_one {
                chosen = Some((index, d.name().unwrap_or_else(|_| "NVIDIA GPU".into())));
                break;
            }
        }
        let Some((index, name)) = chosen else {
            return Err(format!(
                "no sensor: none of NVML's {count} devices matches the Vulkan device ({})",
                dev.pci_bus.as_deref().unwrap_or("no PCI address")
            ));
        };
        let has_energy = nvml
            .device_by_index(index)
            .and_then(|d| d.total_energy_consumption())
            .is_ok();
        Ok(NvmlSensor {
            nvml,
            index,
            name,
            has_energy,
        })
    }
}

impl Sensor for NvmlSensor {
    fn name(&self) -> String {
        format!("NVML: {}", self.name)
    }

    fn read(&mut self) -> Result<Reading, SensorError> {
        let err = |e: nvml_wrapper::error::NvmlError| SensorError::Nvml(e.to_string());
        let d = self.nvml.device_by_index(self.index).map_err(err)?;
        let temp = d.temperature(TemperatureSensor::Gpu).map_err(err)?;
        // Milliwatts; on Hopper the driver's one-second average.
        let power = d.power_usage().map_err(err)?;
        let energy = if self.has_energy {
            // Millijoules since the driver loaded.
            Some(d.total_energy_consumption().map_err(err)? as f64 * 1e-3)
        } else {
            None
        };
        Ok(Reading {
            at: std::time::Instant::now(),
            temp_c: Some(f64::from(temp)),
            power_w: Some(f64::from(power) * 1e-3),
            energy_j: energy,
            clock_mhz: d.clock_info(Clock::Graphics).ok().map(f64::from),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On CI machines (no NVIDIA driver) the open is a notice, not an error or a panic; where a
    /// driver is present the same call must find the one GPU or say why not.
    #[test]
    fn nvml_absent_is_a_notice() {
        match NvmlSensor::open(&DeviceMatch {
            vendor_id: crate::sensor::VENDOR_NVIDIA,
            pci_bus: Some("0000:ff:1f.7".into()),
            uuid: None,
        }) {
            Err(notice) => assert!(notice.starts_with("no sensor"), "{notice}"),
            Ok(s) => panic!("matched {} to an address no GPU has", s.name()),
        }
    }
}
