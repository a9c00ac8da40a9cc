//! The energy meter: joules since it started, from the device's energy counter where there is
//! one, else by integrating power samples (trapezoid rule); J/token and tokens/J from it.

use std::time::Instant;

use crate::sensor::Reading;

/// Energy used since the first reading fed to it.
#[derive(Debug, Clone, Default)]
pub struct EnergyMeter {
    /// Sum of the counter's increases, J.
    counted: f64,
    /// Integral of power, J (kept alongside, for intervals the counter does not cover).
    integrated: f64,
    /// Whether every interval so far had a counter difference.
    counter_whole: bool,
    last_counter: Option<f64>,
    last_power: Option<(Instant, f64)>,
    last_at: Option<Instant>,
    fed: bool,
}

impl EnergyMeter {
    /// A meter at zero.
    pub fn new() -> Self {
        EnergyMeter {
            counter_whole: true,
            ..Default::default()
        }
    }

    /// Takes one reading (readings in time order). Returns the power over the interval since
    /// the previous reading as the counter gives it (ΔE/Δt), for sources that report energy
    /// but no power (Intel's hwmon).
    pub fn feed(&mut self, r: &Reading) -> Option<f64> {
        let mut counter_power = None;
        let mut counted_now = false;
        if let (Some(e), Some(prev)) = (r.energy_j, self.last_counter) {
            // A counter that went backwards was reset (driver reload) or wrapped: that
            // interval falls back to integrated power.
            if e >= prev {
                self.counted += e - prev;
                counted_now = true;
                if let Some(t0) = self.last_at {
                    let dt = r.at.saturating_duration_since(t0).as_secs_f64();
                    if dt > 0.0 {
                        counter_power = Some((e - prev) / dt);
                    }
                }
            }
        }
        let power = r.power_w.or(counter_power);
        if let (Some(p), Some((t0, p0))) = (power, self.last_power) {
            let dt = r.at.saturating_duration_since(t0).as_secs_f64();
            let step = 0.5 * (p + p0) * dt;
            self.integrated += step;
            if !counted_now {
                // Keep the counted sum whole: the interval the counter missed is integrated.
                self.counted += step;
            }
        }
        if self.fed && !counted_now {
            self.counter_whole = false;
        }
        self.fed = true;
        self.last_at = Some(r.at);
        self.last_counter = r.energy_j;
        if let Some(p) = power {
            self.last_power = Some((r.at, p));
        } else {
            self.last_power = self.last_power.map(|(_, p)| (r.at, p));
        }
        counter_power
    }

    /// Joules since the first reading: the counter's sum (with integrated power filling any
    /// interval it missed), or integrated power where there is no counter.
    pub fn joules(&self) -> f64 {
        if self.last_counter.is_some() || !self.counter_whole {
            self.counted
        } else {
            self.integrated
        }
    }

    /// Whether the figure comes from the device's counter for every interval.
    pub fn from_counter(&self) -> bool {
        self.fed && self.counter_whole && self.last_counter.is_some()
    }
}

/// Joules per token; `None` without tokens or without a positive energy.
pub fn joules_per_token(joules: f64, tokens: u64) -> Option<f64> {
    (tokens > 0 && joules.is_finite() && joules > 0.0).then(|| joules / tokens as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn reading(t0: Instant, ms: u64, power: Option<f64>, energy: Option<f64>) -> Reading {
        Reading {
            at: t0 + Duration::from_millis(ms),
            temp_c: None,
            power_w: power,
            energy_j: energy,
            clock_mhz: None,
        }
    }

    #[test]
    fn integrates_power_by_trapezoids() {
        let t0 = Instant::now();
        let mut m = EnergyMeter::new();
        // 100 W rising linearly to 300 W over 2 s: 400 J.
        for i in 0..=20 {
            m.feed(&reading(t0, i * 100, Some(100.0 + 10.0 * i as f64), None));
        }
        assert!((m.joules() - 400.0).abs() < 1e-9, "{}", m.joules());
        assert!(!m.from_counter());
        assert_eq!(joules_per_token(m.joules(), 100), Some(4.0));
    }

    #[test]
    fn counter_wins_and_derives_power() {
        let t0 = Instant::now();
        let mut m = EnergyMeter::new();
        m.feed(&reading(t0, 0, None, Some(5000.0)));
        let p = m.feed(&reading(t0, 500, None, Some(5100.0)));
        assert!((p.unwrap_or(0.0) - 200.0).abs() < 1e-9);
        m.feed(&reading(t0, 1000, None, Some(5250.0)));
        assert!((m.joules() - 250.0).abs() < 1e-9);
        assert!(m.from_counter());
    }

    #[test]
    fn a_counter_reset_falls_back_to_power_for_that_interval() {
        let t0 = Instant::now();
        let mut m = EnergyMeter::new();
        m.feed(&reading(t0, 0, Some(100.0), Some(1000.0)));
        m.feed(&reading(t0, 1000, Some(100.0), Some(1100.0))); // +100 J counted
        m.feed(&reading(t0, 2000, Some(100.0), Some(3.0))); // reset: 100 J integrated
        m.feed(&reading(t0, 3000, Some(100.0), Some(103.0))); // +100 J counted
        assert!((m.joules() - 300.0).abs() < 1e-9, "{}", m.joules());
        assert!(!m.from_counter());
    }

    #[test]
    fn no_tokens_or_no_energy_has_no_ratio() {
        assert_eq!(joules_per_token(10.0, 0), None);
        assert_eq!(joules_per_token(0.0, 10), None);
        assert_eq!(joules_per_token(f64::NAN, 10), None);
    }
}
