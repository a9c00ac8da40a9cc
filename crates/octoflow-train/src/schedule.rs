//! Learning-rate schedules with linear warmup, as Hugging Face transformers defines them
//! (`get_constant_schedule_with_warmup`, `get_linear_schedule_with_warmup`,
//! `get_cosine_schedule_with_warmup` with half a cosine cycle).

use std::str::FromStr;

use crate::error::TrainError;

/// The shape of the learning rate after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Schedule {
    /// The peak rate from the end of warmup on.
    Constant,
    /// Linear decay from the peak at the end of warmup to 0 at `total`.
    Linear,
    /// Half a cosine from the peak at the end of warmup to 0 at `total`.
    Cosine,
}

impl FromStr for Schedule {
    type Err = TrainError;

    /// `"constant"`, `"linear"` or `"cosine"` (ASCII case ignored).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "constant" => Ok(Self::Constant),
            "linear" => Ok(Self::Linear),
            "cosine" => Ok(Self::Cosine),
            _ => Err(TrainError::UnknownSchedule(s.to_string())),
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Constant => "constant",
            Self::Linear => "linear",
            Self::Cosine => "cosine",
        })
    }
}

/// The learning rate of 0-based optimizer step `step` with peak rate `lr`, `warmup` warmup
/// steps and `total` steps in all, with transformers' semantics:
///
/// - warmup (`step < warmup`): `lr * step / warmup` (so step 0 has rate 0);
/// - constant: `lr`;
/// - linear: `lr * max(0, (total - step) / (total - warmup))`;
/// - cosine: `lr * max(0, 0.5 * (1 + cos(pi * (step - warmup) / (total - warmup))))`.
///
/// Denominators are at least 1, as in transformers. Computed in f64, returned as f32.
pub fn lr_at(s: Schedule, lr: f32, warmup: u64, total: u64, step: u64) -> f32 {
    let lr = f64::from(lr);
    if step < warmup {
        return (lr * step as f64 / warmup.max(1) as f64) as f32;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let factor = match s {
        Schedule::Constant => 1.0,
        Schedule::Linear => ((total as f64 - step as f64) / span).max(0.0),
        Schedule::Cosine => {
            let progress = (step - warmup) as f64 / span;
            (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0)
        }
    };
    (lr * factor) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f32, want: f64) {
        assert!(
            (f64::from(got) - want).abs() <= 1e-6 * want.abs().max(1e-3),
            "got {got}, want {want}"
        );
    }

    #[test]
    fn warmup_is_linear_from_zero() {
        for s in [Schedule::Constant, Schedule::Linear, Schedule::Cosine] {
            close(lr_at(s, 1e-3, 10, 100, 0), 0.0);
            close(lr_at(s, 1e-3, 10, 100, 1), 1e-4);
            close(lr_at(s, 1e-3, 10, 100, 5), 5e-4);
            close(lr_at(s, 1e-3, 10, 100, 9), 9e-4);
            close(lr_at(s, 1e-3, 10, 100, 10), 1e-3);
        }
    }

    /// Values worked out by hand from transformers' lambdas (lr 2e-4, warmup 10, total 110).
    #[test]
    fn matches_hand_computed_transformers_values() {
        // linear: (110 - step) / 100
        close(lr_at(Schedule::Linear, 2e-4, 10, 110, 35), 2e-4 * 0.75);
        close(lr_at(Schedule::Linear, 2e-4, 10, 110, 60), 1e-4);
        close(lr_at(Schedule::Linear, 2e-4, 10, 110, 109), 2e-6);
        close(lr_at(Schedule::Linear, 2e-4, 10, 110, 110), 0.0);
        close(lr_at(Schedule::Linear, 2e-4, 10, 110, 500), 0.0);
        // cosine: 0.5 * (1 + cos(pi * (step - 10) / 100))
        close(lr_at(Schedule::Cosine, 2e-4, 10, 110, 60), 1e-4); // cos(pi/2) = 0
        close(
            lr_at(Schedule::Cosine, 2e-4, 10, 110, 35),
            2e-4 * 0.853_553_390_593_273_8,
        ); // (1+1/sqrt2)/2
        close(
            lr_at(Schedule::Cosine, 2e-4, 10, 110, 85),
            2e-4 * 0.146_446_609_406_726_2,
        );
        close(lr_at(Schedule::Cosine, 2e-4, 10, 110, 110), 0.0);
        // constant
        close(lr_at(Schedule::Constant, 2e-4, 10, 110, 77), 2e-4);
        close(lr_at(Schedule::Constant, 2e-4, 0, 110, 0), 2e-4);
        // no warmup: step 0 is the peak
        close(lr_at(Schedule::Linear, 1.0, 0, 4, 0), 1.0);
        close(lr_at(Schedule::Linear, 1.0, 0, 4, 1), 0.75);
        close(lr_at(Schedule::Cosine, 1.0, 0, 4, 2), 0.5);
    }

    #[test]
    fn degenerate_totals_do_not_divide_by_zero() {
        let v = lr_at(Schedule::Cosine, 1.0, 5, 5, 5);
        assert!(v.is_finite());
        let v = lr_at(Schedule::Linear, 1.0, 5, 0, 7);
        assert_eq!(v, 0.0);
    }

    #[test]
    fn parses_names_and_rejects_others() {
        assert_eq!(
            "constant".parse::<Schedule>().ok(),
            Some(Schedule::Constant)
        );
        assert_eq!("Linear".parse::<Schedule>().ok(), Some(Schedule::Linear));
        assert_eq!("cosine".parse::<Schedule>().ok(), Some(Schedule::Cosine));
        let e = "cosin".parse::<Schedule>().expect_err("not a schedule");
        assert!(e.to_string().contains("\"cosin\""), "{e}");
        for s in [Schedule::Constant, Schedule::Linear, Schedule::Cosine] {
            assert_eq!(s.to_string().parse::<Schedule>().ok(), Some(s));
        }
    }
}
