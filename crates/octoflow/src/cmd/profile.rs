//! `--profile`: GPU time per kernel of one submit, as a table for stderr, with each kernel's
//! floor where it declares what it moves and computes (`Chain::set_cost`).

use octoflow_vk::{LabelTime, FLOOR_RATES};

/// Formats `times` (summed per kernel over one submit of `steps` steps): kernel, dispatches,
/// total and per-step microseconds, share of the submit, and the floor per step (bytes at
/// 3.0 TB/s or flops at 500 TFLOP/s, whichever is longer; `-` where the kernel declares no
/// cost) with the measured time as a multiple of it.
pub fn table(times: &[LabelTime], steps: usize) -> String {
    let total: f64 = times.iter().map(|t| t.total_ns).sum();
    let steps = steps.max(1) as f64;
    let mut out = format!(
        "GPU time of the last submit ({steps} steps, {:.1} us/step; floors at {:.1} TB/s, {:.0} TFLOP/s):\n\
         {:<28} {:>9} {:>12} {:>12} {:>7} {:>13} {:>8}\n",
        total / 1e3 / steps,
        FLOOR_RATES.0 / 1e12,
        FLOOR_RATES.1 / 1e12,
        "kernel",
        "dispatches",
        "total us",
        "us/step",
        "share",
        "floor us/step",
        "x floor"
    );
    let (mut floor_sum, mut covered) = (0.0, 0.0);
    for t in times {
        let (floor, ratio) = match t.floor_ns {
            Some(f) if f > 0.0 => {
                floor_sum += f;
                covered += t.total_ns;
                let us = f / 1e3 / steps;
                // tiny floors keep three significant digits
                let digits = if us < 0.1 { 4 } else { 2 };
                (format!("{us:.digits$}"), format!("{:.1}", t.total_ns / f))
            }
            _ => ("-".to_string(), "-".to_string()),
        };
        out.push_str(&format!(
            "{:<28} {:>9} {:>12.1} {:>12.2} {:>6.1}% {:>13} {:>8}\n",
            t.label,
            t.count,
            t.total_ns / 1e3,
            t.total_ns / 1e3 / steps,
            100.0 * t.total_ns / total.max(1.0),
            floor,
            ratio
        ));
    }
    if floor_sum > 0.0 {
        out.push_str(&format!(
            "kernels with a floor: {:.1} us/step measured, floor {:.2} us/step ({:.1}x)\n",
            covered / 1e3 / steps,
            floor_sum / 1e3 / steps,
            covered / floor_sum
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lt(label: &str, count: usize, total_ns: f64, floor_ns: Option<f64>) -> LabelTime {
        LabelTime {
            label: label.into(),
            count,
            total_ns,
            floor_ns,
        }
    }

    #[test]
    fn the_table_shows_floors_and_their_multiples_where_known() {
        let times = [
            lt("matvec_q8_0", 4, 40_000.0, Some(10_000.0)),
            lt("attention_decode", 2, 20_000.0, None),
        ];
        let t = table(&times, 2);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("2 steps, 30.0 us/step"), "{t}");
        let mv: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            mv,
            ["matvec_q8_0", "4", "40.0", "20.00", "66.7%", "5.00", "4.0"],
            "{t}"
        );
        let at: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(at[5..], ["-", "-"], "{t}");
        assert!(
            lines[4].contains("20.0 us/step measured, floor 5.00 us/step (4.0x)"),
            "{t}"
        );
    }
}
