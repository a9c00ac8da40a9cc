//! Homeostasis: read the GPU's temperature, power and energy, and pace the work so that a
//! temperature or power target is held without the device's own settings being touched
//! (docs/HOMEOSTASIS.md).
//!
//! - [`sensor`]: the [`Sensor`] trait, one [`Reading`], and [`open`] — the source that matches
//!   the Vulkan device in use (by PCI address or UUID), or a one-line notice why there is none.
//! - [`nvml`]: NVIDIA through NVML, loaded at run time.
//! - [`hwmon`]: AMD and Intel through Linux hwmon in sysfs.
//! - [`controller`]: the PI controller (anti-windup) that turns a measured value and its target
//!   into an idle fraction.
//! - [`energy`]: the energy meter (the counter where there is one, else integrated power).
//! - [`pacer`]: the sampling thread and the handle the submit loops call
//!   ([`Pacer::before_submit`]), which turns the idle fraction into a delay per submit.

pub mod controller;
pub mod energy;
pub mod hwmon;
pub mod nvml;
pub mod pacer;
pub mod sensor;
#[cfg(test)]
mod sim;

pub use controller::{Controller, Gains};
pub use energy::EnergyMeter;
pub use pacer::{Pacer, PacerOptions, Snapshot, Targets};
pub use sensor::{open, DeviceMatch, Reading, Sensor, SensorError};
