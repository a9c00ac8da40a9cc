//! The pacer: a sampling thread that reads the sensor and runs the controllers, and the
//! cloneable handle whose [`Pacer::before_submit`] the submit loops call.
//!
//! Pacing is duty-cycle control: the loop's time between two `before_submit` calls is its busy
//! time (recording, the GPU's run, reading back), and before the next submit the pacer sleeps
//! `busy · u / (1 − u)`, so the idle share of wall time is the controller's `u` whether a
//! submit runs one token step or K of them ([`delay_for`]). Only the timing of our own submits
//! changes: no clock lock, no power-limit write, nothing the device keeps after we exit.
//!
//! Without a target the handle does nothing (one branch per submit). Without a sensor there is
//! no handle state at all ([`Pacer::off`]). A sensor that keeps failing switches pacing off
//! with a one-line warning; the run goes on unpaced.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::controller::{Controller, Gains};
use crate::energy::EnergyMeter;
use crate::sensor::{Reading, Sensor};

/// Consecutive failed reads after which the sensor is given up.
const MAX_FAILURES: u32 = 3;
/// Longest busy interval one delay is computed from: a loop that waited for work (serve with
/// no request) did not keep the GPU busy, and its next submit must not pay for that wait.
const MAX_BUSY: Duration = Duration::from_secs(5);

/// What to hold. Both may be set: the larger idle fraction wins, so both stay at or below.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Targets {
    /// GPU temperature, °C.
    pub temp_c: Option<f64>,
    /// Board power, W.
    pub power_w: Option<f64>,
}

impl Targets {
    /// Whether anything is to be held.
    pub fn any(&self) -> bool {
        self.temp_c.is_some() || self.power_w.is_some()
    }
}

impl std::fmt::Display for Targets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.temp_c, self.power_w) {
            (None, None) => f.write_str("none"),
            (Some(t), None) => write!(f, "{t:.0} °C"),
            (None, Some(p)) => write!(f, "{p:.0} W"),
            (Some(t), Some(p)) => write!(f, "{t:.0} °C, {p:.0} W"),
        }
    }
}

/// The largest idle fraction by default. A board draws well above its resting power between
/// submits (its clocks stay up), so a low power target needs the GPU idle most of the time:
/// docs/HOMEOSTASIS.md has the H100's figures.
pub const MAX_IDLE: f64 = 0.98;

/// Pacer settings.
#[derive(Debug, Clone)]
pub struct PacerOptions {
    pub targets: Targets,
    /// Sampling period (10 Hz by default).
    pub period: Duration,
    /// Largest idle fraction.
    pub max_idle: f64,
    /// CSV of every sample: `t_s,temp_c,power_w,energy_j,clock_mhz,idle_fraction,delay_s,unix_s`.
    pub log: Option<PathBuf>,
}

impl Default for PacerOptions {
    fn default() -> Self {
        PacerOptions {
            targets: Targets::default(),
            period: Duration::from_millis(100),
            max_idle: MAX_IDLE,
            log: None,
        }
    }
}

/// The delay before a submit after `busy` of work at idle fraction `idle`: idle time divided
/// by busy time is `idle / (1 − idle)`.
pub fn delay_for(busy: Duration, idle: f64) -> Duration {
    // NaN and non-positive fractions pace nothing.
    if idle.is_nan() || idle <= 0.0 {
        return Duration::ZERO;
    }
    let idle = idle.min(0.99);
    busy.min(MAX_BUSY).mul_f64(idle / (1.0 - idle))
}

/// The latest figures, for `/metrics`, banners and bench.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    pub temp_c: Option<f64>,
    pub power_w: Option<f64>,
    pub clock_mhz: Option<f64>,
    /// Energy since the pacer started, J.
    pub energy_j: f64,
    /// The controllers' idle fraction now.
    pub idle_fraction: f64,
    /// The last delay inserted before a submit, s.
    pub last_delay_s: f64,
    /// All delays inserted, s.
    pub delay_total_s: f64,
    /// Whether pacing is on (a target set and the sensor alive).
    pub pacing: bool,
}

struct Measured {
    sensor: Box<dyn Sensor>,
    meter: EnergyMeter,
    last: Option<Reading>,
    power: Option<f64>,
    power_ctl: Option<Controller>,
    temp_ctl: Option<Controller>,
    failures: u32,
    log: Option<std::io::BufWriter<std::fs::File>>,
}

struct Shared {
    name: String,
    targets: Targets,
    start: Instant,
    measured: Mutex<Measured>,
    /// f64 bits of the idle fraction.
    idle: AtomicU64,
    pacing: AtomicBool,
    alive: AtomicBool,
    stop: AtomicBool,
    /// End of the previous `before_submit` (its own sleep excluded from the next busy time).
    last_submit: Mutex<Option<Instant>>,
    last_delay_ns: AtomicU64,
    delay_total_ns: AtomicU64,
}

/// Stops and joins the sampling thread when the last handle goes.
struct Guard {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

/// The handle the submit loops hold; clones share one sampling thread.
#[derive(Clone, Default)]
pub struct Pacer {
    inner: Option<Arc<Guard>>,
}

impl std::fmt::Debug for Pacer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pacer")
            .field("sensor", &self.sensor_name())
            .field("targets", &self.targets())
            .finish()
    }
}

impl Pacer {
    /// No sensor: nothing is measured or paced.
    pub fn off() -> Self {
        Pacer { inner: None }
    }

    /// Starts sampling `sensor`; paces when `opts.targets` has a target. Fails only when the
    /// log file cannot be created or the thread cannot start.
    pub fn start(sensor: Box<dyn Sensor>, opts: PacerOptions) -> std::io::Result<Self> {
        let log = match &opts.log {
            Some(path) => {
                let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
                writeln!(
                    f,
                    "t_s,temp_c,power_w,energy_j,clock_mhz,idle_fraction,delay_s,unix_s"
                )?;
                Some(f)
            }
            None => None,
        };
        let t = opts.targets;
        let shared = Arc::new(Shared {
            name: sensor.name(),
            targets: t,
            start: Instant::now(),
            measured: Mutex::new(Measured {
                sensor,
                meter: EnergyMeter::new(),
                last: None,
                power: None,
                power_ctl: t
                    .power_w
                    .map(|w| Controller::new(w, Gains::power(w), opts.max_idle)),
                temp_ctl: t
                    .temp_c
                    .map(|c| Controller::new(c, Gains::temperature(), opts.max_idle)),
                failures: 0,
                log,
            }),
            idle: AtomicU64::new(0f64.to_bits()),
            pacing: AtomicBool::new(t.any()),
            alive: AtomicBool::new(true),
            stop: AtomicBool::new(false),
            last_submit: Mutex::new(None),
            last_delay_ns: AtomicU64::new(0),
            delay_total_ns: AtomicU64::new(0),
        });
        // The first reading now, so energy counts from the start.
        sample(&shared);
        let s = shared.clone();
        let period = opts.period;
        let thread = std::thread::Builder::new()
            .name("octoflow-pacer".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Relaxed) && s.alive.load(Ordering::Relaxed) {
                    std::thread::sleep(period);
                    sample(&s);
                }
            })?;
        Ok(Pacer {
            inner: Some(Arc::new(Guard {
                shared,
                thread: Mutex::new(Some(thread)),
            })),
        })
    }

    fn shared(&self) -> Option<&Shared> {
        self.inner.as_deref().map(|g| &*g.shared)
    }

    /// Call right before each submit. Sleeps in proportion to the busy time since the previous
    /// call while a target is exceeded; returns at once otherwise.
    pub fn before_submit(&self) {
        let Some(s) = self.shared() else { return };
        if !s.pacing.load(Ordering::Relaxed) {
            return;
        }
        let now = Instant::now();
        let mut last = s.last_submit.lock().unwrap_or_else(|e| e.into_inner());
        let idle = f64::from_bits(s.idle.load(Ordering::Relaxed));
        let delay = last.map_or(Duration::ZERO, |t| {
            delay_for(now.saturating_duration_since(t), idle)
        });
        if !delay.is_zero() {
            std::thread::sleep(delay);
            s.delay_total_ns
                .fetch_add(delay.as_nanos() as u64, Ordering::Relaxed);
        }
        s.last_delay_ns
            .store(delay.as_nanos() as u64, Ordering::Relaxed);
        *last = Some(Instant::now());
    }

    /// Call when the loop runs out of work (it waits for requests): the wait is not busy time.
    pub fn mark_idle(&self) {
        if let Some(s) = self.shared() {
            *s.last_submit.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }

    /// Whether a sensor is being read.
    pub fn has_sensor(&self) -> bool {
        self.shared()
            .is_some_and(|s| s.alive.load(Ordering::Relaxed))
    }

    /// The sensor's name (`None` without one).
    pub fn sensor_name(&self) -> Option<String> {
        self.shared().map(|s| s.name.clone())
    }

    /// The targets held.
    pub fn targets(&self) -> Targets {
        self.shared().map_or_else(Targets::default, |s| s.targets)
    }

    /// Energy since the start, J, reading the sensor now (bench takes it at each test's
    /// boundaries, where a 100 ms old sample would be too coarse). `None` without a sensor.
    pub fn energy_now(&self) -> Option<f64> {
        let s = self.shared()?;
        if !s.alive.load(Ordering::Relaxed) {
            return None;
        }
        sample(s);
        let m = s.measured.lock().unwrap_or_else(|e| e.into_inner());
        Some(m.meter.joules())
    }

    /// The latest figures.
    pub fn snapshot(&self) -> Snapshot {
        let Some(s) = self.shared() else {
            return Snapshot::default();
        };
        let m = s.measured.lock().unwrap_or_else(|e| e.into_inner());
        Snapshot {
            temp_c: m.last.and_then(|r| r.temp_c),
            power_w: m.power,
            clock_mhz: m.last.and_then(|r| r.clock_mhz),
            energy_j: m.meter.joules(),
            idle_fraction: f64::from_bits(s.idle.load(Ordering::Relaxed)),
            last_delay_s: s.last_delay_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            delay_total_s: s.delay_total_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            pacing: s.pacing.load(Ordering::Relaxed),
        }
    }
}

/// One sample: read, meter, control, log. A read that fails [`MAX_FAILURES`] times in a row
/// turns pacing off for good, with one warning.
fn sample(s: &Shared) {
    let mut m = s.measured.lock().unwrap_or_else(|e| e.into_inner());
    if !s.alive.load(Ordering::Relaxed) {
        return;
    }
    let r = match m.sensor.read() {
        Ok(r) => {
            m.failures = 0;
            r
        }
        Err(e) => {
            m.failures += 1;
            if m.failures >= MAX_FAILURES {
                s.alive.store(false, Ordering::Relaxed);
                s.idle.store(0f64.to_bits(), Ordering::Relaxed);
                let was_pacing = s.pacing.swap(false, Ordering::Relaxed);
                tracing::warn!(
                    "sensor {} failed {MAX_FAILURES} times ({e}); {}",
                    s.name,
                    if was_pacing {
                        "pacing off, running unpaced"
                    } else {
                        "no more readings"
                    }
                );
            }
            return;
        }
    };
    let dt = m
        .last
        .map_or(0.0, |l| r.at.saturating_duration_since(l.at).as_secs_f64());
    let counter_power = m.meter.feed(&r);
    let power = r.power_w.or(counter_power);
    m.power = power.or(m.power);
    m.last = Some(r);
    let mut idle = 0.0f64;
    if let (Some(c), Some(p)) = (m.power_ctl.as_mut(), power) {
        idle = idle.max(c.update(p, dt));
    }
    if let (Some(c), Some(t)) = (m.temp_ctl.as_mut(), r.temp_c) {
        idle = idle.max(c.update(t, dt));
    }
    if s.pacing.load(Ordering::Relaxed) {
        s.idle.store(idle.to_bits(), Ordering::Relaxed);
    }
    let t_s = r.at.saturating_duration_since(s.start).as_secs_f64();
    let delay = s.delay_total_ns.load(Ordering::Relaxed) as f64 * 1e-9;
    let joules = m.meter.joules();
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    // Wall-clock time too, so the trace lines up with a load generator's or another log's.
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let line = format!(
        "{t_s:.3},{},{},{joules:.3},{},{idle:.4},{delay:.4},{unix:.3}",
        opt(r.temp_c),
        opt(power),
        opt(r.clock_mhz)
    );
    if let Some(f) = m.log.as_mut() {
        // A full disk must not stop the run; the log just ends.
        if writeln!(f, "{line}").and_then(|()| f.flush()).is_err() {
            m.log = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sensor::SensorError;

    #[test]
    fn delay_keeps_the_idle_share() {
        let busy = Duration::from_millis(30);
        for idle in [0.1, 0.25, 0.5, 0.9] {
            let d = delay_for(busy, idle).as_secs_f64();
            let share = d / (d + busy.as_secs_f64());
            assert!((share - idle).abs() < 1e-6, "idle {idle}: share {share}");
        }
        assert_eq!(delay_for(busy, 0.0), Duration::ZERO);
        assert_eq!(delay_for(busy, f64::NAN), Duration::ZERO);
    }

    /// Reads a fixed power until `fail_after` reads, then errors.
    struct Flaky {
        reads: Arc<AtomicU64>,
        fail_after: u64,
    }

    impl Sensor for Flaky {
        fn name(&self) -> String {
            "flaky".into()
        }
        fn read(&mut self) -> Result<Reading, SensorError> {
            let n = self.reads.fetch_add(1, Ordering::Relaxed);
            if n >= self.fail_after {
                return Err(SensorError::Other("device lost".into()));
            }
            Ok(Reading {
                power_w: Some(400.0),
                temp_c: Some(80.0),
                ..Reading::empty()
            })
        }
    }

    #[test]
    fn a_sensor_failing_mid_run_turns_pacing_off() {
        let reads = Arc::new(AtomicU64::new(0));
        let pacer = Pacer::start(
            Box::new(Flaky {
                reads: reads.clone(),
                fail_after: 10,
            }),
            PacerOptions {
                targets: Targets {
                    power_w: Some(200.0),
                    temp_c: None,
                },
                period: Duration::from_millis(5),
                ..Default::default()
            },
        )
        .expect("start");
        // Over target: the pacer is pacing while the sensor works.
        let deadline = Instant::now() + Duration::from_secs(10);
        while pacer.snapshot().idle_fraction == 0.0 && pacer.has_sensor() {
            assert!(Instant::now() < deadline, "never paced");
            std::thread::sleep(Duration::from_millis(1));
        }
        while pacer.has_sensor() {
            assert!(Instant::now() < deadline, "failing sensor never given up");
            pacer.before_submit();
            std::thread::sleep(Duration::from_millis(1));
        }
        let snap = pacer.snapshot();
        assert!(!snap.pacing);
        assert_eq!(snap.idle_fraction, 0.0);
        // Submits go on, undelayed.
        let t = Instant::now();
        for _ in 0..100 {
            pacer.before_submit();
        }
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(pacer.energy_now(), None);
    }

    #[test]
    fn without_target_nothing_is_delayed_and_energy_is_measured() {
        let reads = Arc::new(AtomicU64::new(0));
        let pacer = Pacer::start(
            Box::new(Flaky {
                reads,
                fail_after: u64::MAX,
            }),
            PacerOptions {
                period: Duration::from_millis(5),
                ..Default::default()
            },
        )
        .expect("start");
        for _ in 0..50 {
            pacer.before_submit();
            std::thread::sleep(Duration::from_millis(1));
        }
        let snap = pacer.snapshot();
        assert_eq!(snap.delay_total_s, 0.0);
        assert!(!snap.pacing);
        // 400 W for the ~50 ms that passed.
        let e = pacer.energy_now().expect("energy");
        assert!(e > 400.0 * 0.04 && e < 400.0 * 5.0, "{e} J");
    }

    #[test]
    fn the_sample_log_is_csv() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("trace.csv");
        let pacer = Pacer::start(
            Box::new(Flaky {
                reads: Arc::new(AtomicU64::new(0)),
                fail_after: u64::MAX,
            }),
            PacerOptions {
                period: Duration::from_millis(2),
                log: Some(path.clone()),
                ..Default::default()
            },
        )
        .expect("start");
        std::thread::sleep(Duration::from_millis(30));
        drop(pacer);
        let text = std::fs::read_to_string(&path).expect("log");
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("t_s,temp_c,power_w,energy_j,clock_mhz,idle_fraction,delay_s,unix_s")
        );
        let row: Vec<&str> = lines.next().expect("a sample").split(',').collect();
        assert_eq!(row.len(), 8);
        assert_eq!(row[2], "400.000");
    }
}
