//! Counters and gauges, rendered in Prometheus' text format at `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Upper bounds (seconds) of the histogram buckets.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A cumulative histogram of durations.
#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if secs <= b {
                *c += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(&BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// The server's metrics, shared by the handlers and the scheduler.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests answered successfully (completions, chat completions, agent runs).
    pub requests_ok: AtomicU64,
    /// Requests refused for what they asked (4xx of the generation endpoints: bad fields,
    /// unknown model, context exceeded, queue full).
    pub requests_refused: AtomicU64,
    /// Requests the server failed (5xx: engine errors, shutdown).
    pub requests_failed: AtomicU64,
    /// Requests whose client went away before the end.
    pub requests_cancelled: AtomicU64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generation_tokens: AtomicU64,
    /// Requests waiting for an instance.
    pub queue_depth: AtomicU64,
    /// Instances holding a sequence or an agent run's instance.
    pub active_instances: AtomicU64,
    /// Instances in all.
    pub instances: AtomicU64,
    /// Batched steps run.
    pub steps: AtomicU64,
    /// Rows (tokens) run in those steps.
    pub step_rows: AtomicU64,
    /// Sequences placed where their instance's cache held the start of their prompt.
    pub prefix_hits: AtomicU64,
    /// Sequences that found nothing to reuse.
    pub prefix_misses: AtomicU64,
    /// Prompt tokens not run again thanks to those hits.
    pub prefix_cached_tokens: AtomicU64,
    /// Prompts shifted to fit the context (`--context-shift`).
    pub prompts_shifted: AtomicU64,
    /// The KV pool in positions: all of it, what new requests may still be promised, and
    /// what registered prefixes hold (all 0 for an engine without a shared pool).
    pub kv_total: AtomicU64,
    pub kv_available: AtomicU64,
    pub kv_cached: AtomicU64,
    step_time: Mutex<Histogram>,
    ttft: Mutex<Histogram>,
    /// The device's sensor and pacer, set once by the engine (GPU path with a sensor); its
    /// readings are exported as gauges.
    pub pacer: OnceLock<octoflow_homeo::Pacer>,
}

fn observe(h: &Mutex<Histogram>, d: Duration) {
    h.lock()
        .unwrap_or_else(|e| e.into_inner())
        .observe(d.as_secs_f64());
}

impl Metrics {
    /// Records one step of `rows` rows that took `d`.
    pub fn step(&self, rows: usize, d: Duration) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_rows.fetch_add(rows as u64, Ordering::Relaxed);
        observe(&self.step_time, d);
    }

    /// Records a sequence's prompt reuse (`reused` positions, 0 for a miss).
    pub fn prefix_lookup(&self, reused: usize) {
        if reused > 0 {
            self.prefix_hits.fetch_add(1, Ordering::Relaxed);
            self.prefix_cached_tokens
                .fetch_add(reused as u64, Ordering::Relaxed);
        } else {
            self.prefix_misses.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a time to first token.
    pub fn first_token(&self, d: Duration) {
        observe(&self.ttft, d);
    }

    /// Adds one to a counter.
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text exposition (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut put = |name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        put(
            "octoflow_requests_total",
            "counter",
            "Generation requests answered successfully.",
            get(&self.requests_ok),
        );
        put(
            "octoflow_requests_refused_total",
            "counter",
            "Generation requests refused for what they asked (4xx).",
            get(&self.requests_refused),
        );
        put(
            "octoflow_requests_failed_total",
            "counter",
            "Generation requests the server failed (5xx).",
            get(&self.requests_failed),
        );
        put(
            "octoflow_requests_cancelled_total",
            "counter",
            "Requests whose client disconnected before the end.",
            get(&self.requests_cancelled),
        );
        put(
            "octoflow_prefix_cache_hits_total",
            "counter",
            "Sequences whose instance's cache held the start of their prompt.",
            get(&self.prefix_hits),
        );
        put(
            "octoflow_prefix_cache_misses_total",
            "counter",
            "Sequences that found no prompt start to reuse.",
            get(&self.prefix_misses),
        );
        put(
            "octoflow_prefix_cache_tokens_total",
            "counter",
            "Prompt tokens reused from instances' caches instead of run again.",
            get(&self.prefix_cached_tokens),
        );
        put(
            "octoflow_kv_cache_positions",
            "gauge",
            "Positions the KV cache pool holds (0: a cache per instance).",
            get(&self.kv_total),
        );
        put(
            "octoflow_kv_cache_available_positions",
            "gauge",
            "KV positions new requests may still be promised (free or evictable cached blocks).",
            get(&self.kv_available),
        );
        put(
            "octoflow_kv_cache_prefix_positions",
            "gauge",
            "KV positions held by cached prefix blocks, in use or not.",
            get(&self.kv_cached),
        );
        put(
            "octoflow_prompts_shifted_total",
            "counter",
            "Prompts longer than the context that kept their start and newest tokens.",
            get(&self.prompts_shifted),
        );
        put(
            "octoflow_prompt_tokens_total",
            "counter",
            "Prompt tokens processed.",
            get(&self.prompt_tokens),
        );
        put(
            "octoflow_generation_tokens_total",
            "counter",
            "Tokens generated.",
            get(&self.generation_tokens),
        );
        put(
            "octoflow_queue_depth",
            "gauge",
            "Requests waiting for a free instance.",
            get(&self.queue_depth),
        );
        put(
            "octoflow_active_instances",
            "gauge",
            "Instances holding a sequence or an agent run's instance.",
            get(&self.active_instances),
        );
        put(
            "octoflow_instances",
            "gauge",
            "Instances (sequences that can run at once).",
            get(&self.instances),
        );
        put(
            "octoflow_steps_total",
            "counter",
            "Batched forward steps run.",
            get(&self.steps),
        );
        put(
            "octoflow_step_rows_total",
            "counter",
            "Token rows run in batched steps.",
            get(&self.step_rows),
        );
        let lock = |h: &Mutex<Histogram>| {
            let h = h.lock().unwrap_or_else(|e| e.into_inner());
            (h.counts, h.count, h.sum)
        };
        for (h, name, help) in [
            (
                &self.step_time,
                "octoflow_step_seconds",
                "Time of one batched step.",
            ),
            (
                &self.ttft,
                "octoflow_time_to_first_token_seconds",
                "From queueing a request to its first token.",
            ),
        ] {
            let (counts, count, sum) = lock(h);
            Histogram { counts, count, sum }.render(&mut out, name, help);
        }
        if let Some(p) = self.pacer.get().filter(|p| p.has_sensor()) {
            render_sensors(&mut out, &p.snapshot());
        }
        out
    }
}

/// The sensor gauges of `/metrics` (only those the device reports).
fn render_sensors(out: &mut String, s: &octoflow_homeo::Snapshot) {
    let mut put = |name: &str, kind: &str, help: &str, v: Option<f64>| {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    };
    put(
        "octoflow_gpu_temperature_celsius",
        "gauge",
        "GPU temperature.",
        s.temp_c,
    );
    put(
        "octoflow_gpu_power_watts",
        "gauge",
        "GPU board power.",
        s.power_w,
    );
    put(
        "octoflow_gpu_clock_mhz",
        "gauge",
        "GPU graphics clock.",
        s.clock_mhz,
    );
    put(
        "octoflow_gpu_energy_joules_total",
        "counter",
        "GPU energy since the server started.",
        Some(s.energy_j),
    );
    put(
        "octoflow_pacing_idle_fraction",
        "gauge",
        "Share of time the pacer keeps the GPU idle to hold its target (0 unpaced).",
        Some(s.idle_fraction),
    );
    put(
        "octoflow_pacing_delay_seconds",
        "gauge",
        "The delay inserted before the last submit.",
        Some(s.last_delay_s),
    );
    put(
        "octoflow_pacing_delay_seconds_total",
        "counter",
        "All delays inserted before submits.",
        Some(s.delay_total_s),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::default();
        Metrics::inc(&m.requests_ok);
        m.step(3, Duration::from_millis(20));
        let text = m.render();
        assert!(text.contains("octoflow_requests_total 1\n"), "{text}");
        assert!(text.contains("octoflow_step_seconds_bucket{le=\"0.01\"} 0\n"));
        assert!(text.contains("octoflow_step_seconds_bucket{le=\"0.025\"} 1\n"));
        assert!(text.contains("octoflow_step_seconds_count 1\n"));
        assert!(text.contains("octoflow_step_rows_total 3\n"));
    }
}
