//! A simulated GPU under paced submits, for the controller's step-response tests: busy submits
//! of varying length at `p_busy` W, the pacer's delays at `p_idle` W, the board's power
//! following with a 30 ms lag, the driver reporting a one-second average (NVML on Ampere and
//! later), sampled at 10 Hz; the die's temperature a first-order response to power.
//!
//! Time advances in 1 ms ticks; everything is deterministic (a fixed LCG draws the submit
//! lengths), so a failing bound reproduces.

use std::collections::VecDeque;
use std::time::Duration;

use crate::controller::{Controller, Gains};
use crate::pacer::{delay_for, MAX_IDLE};

/// The plant.
#[derive(Debug, Clone, Copy)]
pub struct Plant {
    pub p_busy: f64,
    pub p_idle: f64,
    /// Shortest and longest submit, ms (a decode chain of K steps, a prompt chunk…).
    pub submit_ms: (u64, u64),
    /// Ambient °C and thermal resistance °C/W.
    pub ambient_c: f64,
    pub r_c_per_w: f64,
    /// Thermal time constant, s.
    pub tau_thermal_s: f64,
}

impl Plant {
    pub fn h100_like() -> Self {
        Plant {
            p_busy: 700.0,
            p_idle: 70.0,
            submit_ms: (5, 50),
            ambient_c: 30.0,
            r_c_per_w: 0.08,
            tau_thermal_s: 20.0,
        }
    }
}

/// What the controller holds.
#[derive(Debug, Clone, Copy)]
pub enum Hold {
    Power(f64),
    Temp(f64),
}

/// One sample per 100 ms: time s, measured (averaged) power W, temperature °C, idle fraction.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub t: f64,
    pub power: f64,
    pub temp: f64,
    pub idle: f64,
}

/// Runs `seconds` of paced submits holding `hold`; returns the 10 Hz samples.
pub fn run(plant: Plant, hold: Hold, seconds: f64) -> Vec<Sample> {
    let mut ctl = match hold {
        Hold::Power(w) => Controller::new(w, Gains::power(w), MAX_IDLE),
        Hold::Temp(c) => Controller::new(c, Gains::temperature(), MAX_IDLE),
    };
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next_len = || {
        rng = rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let (lo, hi) = plant.submit_ms;
        lo + (rng >> 33) % (hi - lo + 1)
    };
    let ticks = (seconds * 1000.0) as u64;
    // The step: the pacer starts on a GPU already running unpaced (its board at full power,
    // the die still at ambient).
    let mut board = plant.p_busy;
    let mut temp = plant.ambient_c;
    let mut window: VecDeque<f64> = VecDeque::with_capacity(1000);
    let mut window_sum = 0.0;
    // The submit loop: busy for `busy_left` ticks, then idle for `idle_left`.
    let mut busy_left = next_len();
    let mut busy_len = busy_left;
    let mut idle_left = 0u64;
    let mut idle = 0.0;
    let mut out = Vec::new();
    for tick in 0..ticks {
        let busy = busy_left > 0;
        if busy {
            busy_left -= 1;
        } else {
            idle_left = idle_left.saturating_sub(1);
        }
        if busy_left == 0 && idle_left == 0 && busy {
            // The loop calls before_submit: the delay after this submit's busy time.
            idle_left = delay_for(Duration::from_millis(busy_len), idle).as_millis() as u64;
        }
        if busy_left == 0 && idle_left == 0 {
            busy_len = next_len();
            busy_left = busy_len;
        }
        let p_now = if busy { plant.p_busy } else { plant.p_idle };
        board += (p_now - board) * (1.0 - (-0.001f64 / 0.030).exp());
        temp += (plant.ambient_c + plant.r_c_per_w * board - temp)
            * (1.0 - (-0.001 / plant.tau_thermal_s).exp());
        window.push_back(board);
        window_sum += board;
        if window.len() > 1000 {
            window_sum -= window.pop_front().unwrap_or(0.0);
        }
        if (tick + 1) % 100 == 0 {
            let power = window_sum / window.len() as f64;
            idle = ctl.update(
                match hold {
                    Hold::Power(_) => power,
                    Hold::Temp(_) => temp,
                },
                0.1,
            );
            out.push(Sample {
                t: (tick + 1) as f64 / 1000.0,
                power,
                temp,
                idle,
            });
        }
    }
    out
}

/// Step-response figures of a trace against `target`.
#[derive(Debug)]
pub struct Response {
    /// First time after which the value stays within `band` of the target, s.
    pub settle_s: f64,
    /// Largest excursion past the target on the side opposite to where it started, in units of
    /// the value, after its first crossing (0 if it never crossed).
    pub overshoot: f64,
    /// Sign changes of the error outside a dead zone of `band / 2`, after settling.
    pub crossings: usize,
}

pub fn response(values: &[(f64, f64)], target: f64, band: f64) -> Response {
    let settle_idx = values
        .iter()
        .rposition(|&(_, v)| (v - target).abs() > band)
        .map_or(0, |i| i + 1);
    let settle_s = values.get(settle_idx).map_or(f64::INFINITY, |s| s.0);
    let start_above = values.first().is_some_and(|&(_, v)| v > target);
    let first_cross = values
        .iter()
        .position(|&(_, v)| (v > target) != start_above);
    let overshoot = first_cross.map_or(0.0, |i| {
        values[i..]
            .iter()
            .map(|&(_, v)| if start_above { target - v } else { v - target })
            .fold(0.0, f64::max)
    });
    let mut crossings = 0;
    let mut side = 0i8;
    for &(_, v) in &values[settle_idx.min(values.len())..] {
        let e = v - target;
        let s = if e > band / 2.0 {
            1
        } else if e < -band / 2.0 {
            -1
        } else {
            0
        };
        if s != 0 && side != 0 && s != side {
            crossings += 1;
        }
        if s != 0 {
            side = s;
        }
    }
    Response {
        settle_s,
        overshoot,
        crossings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Means over the last `n` samples (fewer at the start).
    fn smoothed(values: &[(f64, f64)], n: usize) -> Vec<(f64, f64)> {
        (0..values.len())
            .map(|i| {
                let w = &values[i.saturating_sub(n - 1)..=i];
                (
                    values[i].0,
                    w.iter().map(|v| v.1).sum::<f64>() / w.len() as f64,
                )
            })
            .collect()
    }

    /// 95th percentile of |value − target| / target over `values`.
    fn p95_deviation(values: &[(f64, f64)], target: f64) -> f64 {
        let mut d: Vec<f64> = values
            .iter()
            .map(|v| (v.1 - target).abs() / target)
            .collect();
        d.sort_by(f64::total_cmp);
        d.get(d.len() * 95 / 100).copied().unwrap_or(f64::INFINITY)
    }

    /// The power loop's specification (docs/HOMEOSTASIS.md), on the driver's one-second power
    /// averaged over two seconds (the duty cycle's own ripple is not the loop's response):
    /// from an unpaced start within ±5% of the target in 15 s, at most 12% past it, no
    /// sustained oscillation (at most 3 swings across a ±2.5% dead zone in the rest of the
    /// minute); for long submits (five-second means) ±10% in 20 s and at most 5 swings
    /// across ±5%; and the raw one-second readings after 20 s within ±10% at p95 (the goal the
    /// H100 measurement is held to).
    fn power_spec(plant: Plant, target: f64, p95_bound: f64) {
        let trace = run(plant, Hold::Power(target), 60.0);
        let raw: Vec<(f64, f64)> = trace.iter().map(|s| (s.t, s.power)).collect();
        // Submits longer than a tenth of the driver's averaging window make its one-second
        // figure swing between busy and idle whatever the loop does; the mean power the loop
        // holds is then judged over five seconds, as a power budget would be.
        let long = plant.submit_ms.1 > 100;
        let values = if long { smoothed(&raw, 50) } else { raw };
        let band = if long { 0.10 } else { 0.05 };
        let r = response(&smoothed(&values, 20), target, band * target);
        let p95 = p95_deviation(&values[200..], target);
        let label = format!(
            "busy {} W, idle {} W, submits {:?} ms, target {target} W: {r:?}, p95 {p95:.3}",
            plant.p_busy, plant.p_idle, plant.submit_ms
        );
        let (settle, swings) = if long { (20.0, 5) } else { (15.0, 3) };
        assert!(r.settle_s <= settle, "settles too slowly: {label}");
        assert!(r.overshoot <= 0.12 * target, "overshoots: {label}");
        assert!(r.crossings <= swings, "oscillates: {label}");
        assert!(p95 <= p95_bound, "not held: {label}");
    }

    #[test]
    fn power_step_responses_meet_the_spec() {
        let h100 = Plant::h100_like();
        // At 150 W the pacer idles 87% of the time: idle gaps of up to 330 ms between 5–50 ms
        // submits leave a ripple in the one-second average that no controller removes.
        for (target, p95) in [(150.0, 0.15), (250.0, 0.10), (400.0, 0.10)] {
            power_spec(h100, target, p95);
        }
        // A board whose draw between submits stays high (its clocks up) under a load that does
        // not reach its limit, as the H100 was measured (docs/HOMEOSTASIS.md): 150 W is then
        // 10 W above the gaps' draw and needs the GPU idle ~95% of the time.
        power_spec(
            Plant {
                p_busy: 360.0,
                p_idle: 140.0,
                ..h100
            },
            150.0,
            0.10,
        );
        // Short submits only, long submits only, and a small card barely above its target.
        power_spec(
            Plant {
                submit_ms: (2, 4),
                ..h100
            },
            250.0,
            0.10,
        );
        power_spec(
            Plant {
                submit_ms: (100, 300),
                ..h100
            },
            250.0,
            0.10,
        );
        power_spec(
            Plant {
                p_busy: 300.0,
                p_idle: 30.0,
                ..h100
            },
            250.0,
            0.10,
        );
    }

    #[test]
    fn an_unreachable_power_target_pins_the_idle_limit_without_winding_up() {
        // Idle power above the target: the most the pacer can do is its idle limit.
        let plant = Plant {
            p_idle: 120.0,
            ..Plant::h100_like()
        };
        let trace = run(plant, Hold::Power(100.0), 20.0);
        let last = trace.last().map_or(0.0, |s| s.idle);
        assert!((last - MAX_IDLE).abs() < 1e-9, "idle fraction {last}");
    }

    #[test]
    fn a_target_above_full_load_never_paces() {
        let trace = run(Plant::h100_like(), Hold::Power(800.0), 20.0);
        assert!(trace.iter().all(|s| s.idle == 0.0));
    }

    /// The temperature loop's specification: from a cold start, within ±1.5 °C of the target
    /// in 150 s, at most 4 °C past it, no sustained oscillation over five minutes.
    #[test]
    fn temperature_step_response_meets_the_spec() {
        for target in [60.0, 70.0] {
            let trace = run(Plant::h100_like(), Hold::Temp(target), 300.0);
            let values: Vec<(f64, f64)> = trace.iter().map(|s| (s.t, s.temp)).collect();
            let r = response(&values, target, 1.5);
            let label = format!("target {target} °C: {r:?}");
            assert!(r.settle_s <= 150.0, "settles too slowly: {label}");
            assert!(r.overshoot <= 4.0, "overshoots: {label}");
            assert!(r.crossings <= 3, "oscillates: {label}");
        }
    }
}
