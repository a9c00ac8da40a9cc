//! AMD and Intel GPUs through Linux hwmon: `/sys/bus/pci/devices/<pci address>/hwmon/hwmonN/`
//! (the same directory as `/sys/class/drm/cardN/device/hwmon/`).
//!
//! Units as the kernel's hwmon ABI states them: `temp*_input` m°C, `power*_average` and
//! `power*_input` µW, `energy*_input` µJ, `freq*_input` Hz. amdgpu exposes temperature,
//! power (`power1_average`, `power1_input` on newer kernels) and the shader clock (`freq1_input`);
//! i915/xe expose the energy counter (`energy1_input`), from which the pacer derives power.

use std::path::{Path, PathBuf};

use crate::sensor::{Reading, Sensor, SensorError};

/// The hwmon files of one device that exist (read at open; a file that disappears later is an
/// error at the next read).
#[derive(Debug)]
pub struct Hwmon {
    driver: String,
    temp: Option<PathBuf>,
    power: Option<PathBuf>,
    energy: Option<PathBuf>,
    freq: Option<PathBuf>,
}

impl Hwmon {
    /// The hwmon entry of the PCI device `pci` (`dddd:bb:dd.f`) under the sysfs root `sys`
    /// (`/sys`; tests pass a fake tree), or a one-line notice why there is none.
    pub fn open(sys: &Path, pci: &str) -> Result<Self, String> {
        let dir = sys.join("bus/pci/devices").join(pci).join("hwmon");
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("no sensor: {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for hw in entries {
            let first = |prefix: &str, suffixes: &[&str]| -> Option<PathBuf> {
                suffixes.iter().find_map(|suffix| {
                    (1..=8)
                        .map(|i| hw.join(format!("{prefix}{i}_{suffix}")))
                        .find(|p| p.is_file())
                })
            };
            let found = Hwmon {
                driver: std::fs::read_to_string(hw.join("name"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_else(|_| "?".into()),
                temp: first("temp", &["input"]),
                power: first("power", &["average", "input"]),
                energy: first("energy", &["input"]),
                freq: first("freq", &["input"]),
            };
            if found.temp.is_some() || found.power.is_some() || found.energy.is_some() {
                return Ok(found);
            }
        }
        Err(format!(
            "no sensor: {} has no temperature, power or energy file",
            dir.display()
        ))
    }
}

/// One integer sysfs value times `scale`.
fn value(path: &Option<PathBuf>, scale: f64) -> Result<Option<f64>, SensorError> {
    let Some(path) = path else { return Ok(None) };
    let err = |msg: String| SensorError::File {
        path: path.display().to_string(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let v: f64 = text
        .trim()
        .parse::<i64>()
        .map_err(|_| err(format!("expected an integer, found {:?}", text.trim())))?
        as f64;
    Ok(Some(v * scale))
}

impl Sensor for Hwmon {
    fn name(&self) -> String {
        format!("hwmon {}", self.driver)
    }

    fn read(&mut self) -> Result<Reading, SensorError> {
        Ok(Reading {
            at: std::time::Instant::now(),
            temp_c: value(&self.temp, 1e-3)?,
            power_w: value(&self.power, 1e-6)?,
            energy_j: value(&self.energy, 1e-6)?,
            clock_mhz: value(&self.freq, 1e-6)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("temp dir");
        let hw = root
            .path()
            .join("bus/pci/devices/0000:03:00.0/hwmon/hwmon4");
        std::fs::create_dir_all(&hw).expect("mkdir");
        for (name, text) in files {
            std::fs::write(hw.join(name), text).expect("write");
        }
        root
    }

    #[test]
    fn amdgpu_files_are_read_in_their_units() {
        let root = fake_tree(&[
            ("name", "amdgpu\n"),
            ("temp1_input", "61000\n"),
            ("power1_average", "187500000\n"),
            ("freq1_input", "2100000000\n"),
        ]);
        let mut s = Hwmon::open(root.path(), "0000:03:00.0").expect("found");
        assert_eq!(s.name(), "hwmon amdgpu");
        let r = s.read().expect("read");
        assert_eq!(r.temp_c, Some(61.0));
        assert!((r.power_w.unwrap_or(0.0) - 187.5).abs() < 1e-9);
        assert!((r.clock_mhz.unwrap_or(0.0) - 2100.0).abs() < 1e-9);
        assert_eq!(r.energy_j, None);
    }

    #[test]
    fn intel_energy_counter_without_power() {
        let root = fake_tree(&[("name", "i915"), ("energy1_input", "123456789")]);
        let mut s = Hwmon::open(root.path(), "0000:03:00.0").expect("found");
        let r = s.read().expect("read");
        assert_eq!(r.power_w, None);
        assert!((r.energy_j.unwrap_or(0.0) - 123.456789).abs() < 1e-9);
    }

    #[test]
    fn missing_device_or_files_is_a_notice() {
        let root = fake_tree(&[("name", "nvme")]);
        let notice = Hwmon::open(root.path(), "0000:03:00.0").expect_err("no files");
        assert!(notice.starts_with("no sensor"), "{notice}");
        let notice = Hwmon::open(root.path(), "0000:04:00.0").expect_err("no device");
        assert!(notice.starts_with("no sensor"), "{notice}");
    }

    #[test]
    fn garbage_and_vanished_files_are_errors_not_panics() {
        let root = fake_tree(&[("name", "amdgpu"), ("temp1_input", "61000")]);
        let mut s = Hwmon::open(root.path(), "0000:03:00.0").expect("found");
        let t = root
            .path()
            .join("bus/pci/devices/0000:03:00.0/hwmon/hwmon4/temp1_input");
        std::fs::write(&t, "hot").expect("write");
        let e = s.read().expect_err("garbage").to_string();
        assert!(e.contains("expected an integer"), "{e}");
        std::fs::remove_file(&t).expect("rm");
        assert!(s.read().is_err());
    }
}
