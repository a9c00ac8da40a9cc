//! `--profile`: GPU time per kernel of one decode submit, as a table for stderr.

use octoflow_vk::LabelTime;

/// Formats `times` (summed per kernel over one submit of `steps` decode steps): kernel,
/// dispatches, total and per-step microseconds, share of the submit.
pub fn table(times: &[LabelTime], steps: usize) -> String {
    let total: f64 = times.iter().map(|t| t.total_ns).sum();
    let steps = steps.max(1) as f64;
    let mut out = format!(
        "GPU time of the last submit ({steps} steps, {:.1} us/step):\n{:<28} {:>9} {:>12} {:>12} {:>7}\n",
        total / 1e3 / steps,
        "kernel",
        "dispatches",
        "total us",
        "us/step",
        "share"
    );
    for t in times {
        out.push_str(&format!(
            "{:<28} {:>9} {:>12.1} {:>12.2} {:>6.1}%\n",
            t.label,
            t.count,
            t.total_ns / 1e3,
            t.total_ns / 1e3 / steps,
            100.0 * t.total_ns / total.max(1.0)
        ));
    }
    out
}
