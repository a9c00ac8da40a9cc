//! The PI controller that turns a measured value (power in W, temperature in °C) and its target
//! into an **idle fraction**: the share of wall time the pacer keeps the GPU without work.
//!
//! Why the idle fraction: the work-induced power of a GPU running back-to-back submits is
//! `P ≈ P_idle + (P_busy − P_idle)·(1 − u)` when a fraction `u` of the time is idle, so the
//! plant is linear in `u` whatever the submits' lengths; the pacer turns `u` into a delay
//! proportional to each submit's busy time ([`crate::pacer::delay_for`]).
//!
//! Tuning (docs/HOMEOSTASIS.md has the derivation): the error is scaled, `e = (y − r) / scale`,
//! so one set of gains serves any target. Seen from the controller the plant is first order,
//! `G / (τ s + 1)`, with `G = (y_busy − y_idle) / scale` per unit of idle fraction. The integral
//! time is set to the plant's time constant (`Ti = τ`), cancelling its pole, so the loop is
//! `kp·G / (τ s)`: a first-order closed loop with time constant `τ / (kp·G)`, which cannot
//! overshoot on a first-order plant. `kp` is chosen so that the largest `G` we expect still
//! leaves the closed loop slower than the measurement's own lag (NVML's one-second power
//! average), which is what keeps it from oscillating; smaller `G` only make it slower.
//!
//! Anti-windup: conditional integration — the integral stops while the output is pinned at a
//! limit and the error pushes further into it — and the integral itself stays in the output
//! range, so a long stretch below target (a light load) leaves nothing to unwind.

/// Gains of one loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gains {
    /// Proportional gain, idle fraction per unit of scaled error.
    pub kp: f64,
    /// Integral time, s (the plant's time constant).
    pub ti_s: f64,
    /// What one unit of error is, in the measured quantity's unit.
    pub scale: f64,
}

impl Gains {
    /// Power loop for a target of `watts`. The plant's time constant is the driver's power
    /// average (NVML: one second on Ampere and later; amdgpu's `power1_average` similar), the
    /// board itself settling within tens of milliseconds. `G` is at most about 3 (a 700 W
    /// board held at 250 W with 70 W idle: (700 − 70) / 250 ≈ 2.5), so `kp = 0.3` keeps
    /// `τ / (kp·G) ≥ 1.1 τ`.
    pub fn power(watts: f64) -> Self {
        Gains {
            kp: 0.3,
            ti_s: 1.0,
            scale: watts.max(1.0),
        }
    }

    /// Temperature loop. A die's temperature follows its power with a time constant of tens of
    /// seconds (the heat sink, `Ti = 20 s`), `G` per 10 °C about 5 (50 °C between idle and
    /// full load). Starting cold, the integral is empty when the target is first crossed, so
    /// the proportional part must catch the rise: `kp = 1` gives 0.1 of idle per °C over
    /// (the simulated cold start passes its target by under 4 °C), and a closed loop of
    /// `20 / (1·5) = 4 s`, still slower than the die's own response to a power step.
    pub fn temperature() -> Self {
        Gains {
            kp: 1.0,
            ti_s: 20.0,
            scale: 10.0,
        }
    }
}

/// One PI loop holding `target`; its output is an idle fraction in `[0, max]`.
#[derive(Debug, Clone)]
pub struct Controller {
    gains: Gains,
    target: f64,
    max: f64,
    integral: f64,
    output: f64,
}

impl Controller {
    /// A loop holding `target` with `gains`; the output never exceeds `max` (below 1: the GPU
    /// always gets some work, and the delay per submit stays bounded).
    pub fn new(target: f64, gains: Gains, max: f64) -> Self {
        Controller {
            gains,
            target,
            max: max.clamp(0.0, 0.99),
            integral: 0.0,
            output: 0.0,
        }
    }

    /// The target.
    pub fn target(&self) -> f64 {
        self.target
    }

    /// The last output.
    pub fn output(&self) -> f64 {
        self.output
    }

    /// Takes a measurement `y` made `dt_s` seconds after the previous one; returns the idle
    /// fraction to apply until the next. A non-finite measurement changes nothing.
    pub fn update(&mut self, y: f64, dt_s: f64) -> f64 {
        if !y.is_finite() || !dt_s.is_finite() || dt_s <= 0.0 {
            return self.output;
        }
        let g = self.gains;
        let e = (y - self.target) / g.scale;
        let p = g.kp * e;
        let integral = self.integral + g.kp * e * dt_s / g.ti_s;
        let unclamped = p + integral;
        let pinned_high = unclamped > self.max && e > 0.0;
        let pinned_low = unclamped < 0.0 && e < 0.0;
        if !(pinned_high || pinned_low) {
            self.integral = integral.clamp(0.0, self.max);
        }
        self.output = (p + self.integral).clamp(0.0, self.max);
        self.output
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_target_never_paces() {
        let mut c = Controller::new(250.0, Gains::power(250.0), 0.9);
        for _ in 0..1000 {
            assert_eq!(c.update(120.0, 0.1), 0.0);
        }
    }

    #[test]
    fn output_stays_in_range_and_unwinds_quickly() {
        let mut c = Controller::new(100.0, Gains::power(100.0), 0.9);
        for _ in 0..10_000 {
            let u = c.update(1000.0, 0.1);
            assert!((0.0..=0.9).contains(&u));
        }
        // After a long saturation, the first samples below target bring the output down at
        // once: the integral did not wind up past the limit.
        let mut steps = 0;
        while c.update(50.0, 0.1) > 0.0 {
            steps += 1;
            assert!(
                steps < 80,
                "integral wound up: still pacing after {steps} samples"
            );
        }
    }

    #[test]
    fn nan_measurements_change_nothing() {
        let mut c = Controller::new(100.0, Gains::power(100.0), 0.9);
        let u = c.update(150.0, 0.1);
        assert_eq!(c.update(f64::NAN, 0.1), u);
        assert_eq!(c.update(150.0, f64::NAN), u);
    }
}
