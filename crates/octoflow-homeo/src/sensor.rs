//! One sensor source behind one trait, and the choice of source for a Vulkan device.

use std::time::Instant;

/// One reading of a device's sensors; `None` where the device does not expose the quantity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// When it was read.
    pub at: Instant,
    /// GPU (edge or die) temperature, °C.
    pub temp_c: Option<f64>,
    /// Board power, W (the driver's own average where that is all it reports).
    pub power_w: Option<f64>,
    /// Energy counter, J since some origin of the driver's (only differences mean anything).
    pub energy_j: Option<f64>,
    /// Graphics (shader) clock, MHz.
    pub clock_mhz: Option<f64>,
}

impl Reading {
    /// A reading with nothing in it, taken now.
    pub fn empty() -> Self {
        Reading {
            at: Instant::now(),
            temp_c: None,
            power_w: None,
            energy_j: None,
            clock_mhz: None,
        }
    }
}

/// A sensor read failed.
#[derive(Debug, thiserror::Error)]
pub enum SensorError {
    /// A sysfs file could not be read or parsed.
    #[error("{path}: {msg}")]
    File { path: String, msg: String },
    /// NVML refused a query.
    #[error("NVML: {0}")]
    Nvml(String),
    /// The source returned nothing usable.
    #[error("{0}")]
    Other(String),
}

/// A source of readings for one device. Reads are cheap (a few syscalls or driver calls) and
/// are taken by the pacer's sampling thread at 10 Hz.
pub trait Sensor: Send {
    /// What it reads, for notices and banners (`NVML: NVIDIA H100 80GB HBM3`, `hwmon amdgpu`).
    fn name(&self) -> String;
    /// One reading.
    fn read(&mut self) -> Result<Reading, SensorError>;
}

/// Which device the sensor must belong to: what the Vulkan device reports about itself.
#[derive(Debug, Clone, Default)]
pub struct DeviceMatch {
    /// PCI vendor id (0x10de NVIDIA, 0x1002 AMD, 0x8086 Intel).
    pub vendor_id: u32,
    /// PCI address `dddd:bb:dd.f` (VK_EXT_pci_bus_info), where known.
    pub pci_bus: Option<String>,
    /// Vulkan `deviceUUID` as hex digits, where known.
    pub uuid: Option<String>,
}

pub const VENDOR_NVIDIA: u32 = 0x10de;

/// The sensor of the device `dev`, or a one-line notice saying why there is none (no driver
/// library, no hwmon entry, a CPU device…). Never an error: without a sensor nothing is paced
/// and nothing is measured, and the run goes on.
pub fn open(dev: &DeviceMatch) -> Result<Box<dyn Sensor>, String> {
    if dev.vendor_id == VENDOR_NVIDIA {
        return crate::nvml::NvmlSensor::open(dev).map(|s| Box::new(s) as Box<dyn Sensor>);
    }
    let Some(pci) = &dev.pci_bus else {
        return Err("no sensor: the device reports no PCI address (VK_EXT_pci_bus_info)".into());
    };
    crate::hwmon::Hwmon::open(std::path::Path::new("/sys"), pci)
        .map(|s| Box::new(s) as Box<dyn Sensor>)
}

/// A PCI address in one spelling: NVML writes `00000000:01:00.0`, sysfs `0000:01:00.0`.
pub fn normalize_pci(addr: &str) -> Option<(u32, u8, u8, u8)> {
    let (domain, rest) = addr.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u8::from_str_radix(bus, 16).ok()?,
        u8::from_str_radix(dev, 16).ok()?,
        u8::from_str_radix(func, 16).ok()?,
    ))
}

/// A UUID as bare lowercase hex (NVML's `GPU-8c1e…-…` and Vulkan's bytes compare equal).
pub fn normalize_uuid(uuid: &str) -> String {
    let u = uuid.trim();
    let u = u.strip_prefix("GPU-").unwrap_or(u);
    u.chars()
        .filter(|c| c.is_ascii_hexdigit())
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_compare_across_spellings() {
        assert_eq!(
            normalize_pci("00000000:01:00.0"),
            normalize_pci("0000:01:00.0")
        );
        assert_eq!(normalize_pci("0000:c1:00.1"), Some((0, 0xc1, 0, 1)));
        assert_eq!(normalize_pci("garbage"), None);
    }

    #[test]
    fn uuids_compare_across_spellings() {
        assert_eq!(
            normalize_uuid("GPU-8C1E0B2A-1111-2222-3333-444455556666"),
            "8c1e0b2a111122223333444455556666"
        );
    }

    #[test]
    fn a_device_without_pci_address_gets_a_notice() {
        let notice = open(&DeviceMatch {
            vendor_id: 0x10005, // Mesa's lavapipe
            ..Default::default()
        })
        .err()
        .expect("no sensor on a CPU device");
        assert!(notice.contains("no sensor"), "{notice}");
    }
}
