//! Comparing a kernel's output with its CPU reference.

/// Checks `got` against `want` elementwise: `|got - want| <= rel * max(|want|, 0.01 * max|want|)`,
/// so the bound is relative for ordinary values and does not blow up near zero. Any non-finite
/// `got` fails. The error names the worst element.
pub fn check_close(got: &[f32], want: &[f32], rel: f32) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "length {} != reference length {}",
            got.len(),
            want.len()
        ));
    }
    let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
    let mut worst: Option<(usize, f32)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !g.is_finite() {
            return Err(format!("element {i} is {g} (reference {w})"));
        }
        let err = (g - w).abs() / w.abs().max(0.01 * scale).max(f32::MIN_POSITIVE);
        if worst.is_none_or(|(_, e)| err > e) {
            worst = Some((i, err));
        }
    }
    match worst {
        Some((i, err)) if err > rel => Err(format!(
            "element {i}: {} vs reference {} (relative error {err:.3e} > {rel:.1e})",
            got[i], want[i]
        )),
        _ => Ok(()),
    }
}

/// Checks `got` against the sum `a + b` computed on the device: a result that (nearly) cancels its
/// addends carries their rounding, so each element's error is bounded relative to `|a| + |b|`
/// (with `check_close`'s floor of 1% of the largest such scale), not to the sum itself. Any
/// non-finite `got` fails.
pub fn check_close_sum(got: &[f32], a: &[f32], b: &[f32], rel: f32) -> Result<(), String> {
    if got.len() != a.len() || a.len() != b.len() {
        return Err(format!(
            "lengths {} / {} / {} differ",
            got.len(),
            a.len(),
            b.len()
        ));
    }
    let scale = a
        .iter()
        .zip(b)
        .fold(0f32, |m, (x, y)| m.max(x.abs() + y.abs()));
    let mut worst: Option<(usize, f32)> = None;
    for (i, ((&g, &x), &y)) in got.iter().zip(a).zip(b).enumerate() {
        let want = x + y;
        if !g.is_finite() {
            return Err(format!("element {i} is {g} (reference {want})"));
        }
        let size = (x.abs() + y.abs()).max(0.01 * scale).max(f32::MIN_POSITIVE);
        let err = (g - want).abs() / size;
        if worst.is_none_or(|(_, e)| err > e) {
            worst = Some((i, err));
        }
    }
    match worst {
        Some((i, err)) if err > rel => Err(format!(
            "element {i}: {} vs reference {} + {} (error {err:.3e} of the addends > {rel:.1e})",
            got[i], a[i], b[i]
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_never_passes() {
        assert!(check_close(&[f32::NAN], &[f32::NAN], 1.0).is_err());
        assert!(check_close(&[1.0, f32::INFINITY], &[1.0, 2.0], 1e9).is_err());
    }

    #[test]
    fn errors_are_relative_with_a_floor_near_zero() {
        assert!(check_close(&[100.001, 0.0], &[100.0, 0.0], 1e-4).is_ok());
        assert!(check_close(&[100.1], &[100.0], 1e-4).is_err());
        // 1e-6 off a zero next to 100s is 1e-6 of the floor (1.0): fine at 1e-5.
        assert!(check_close(&[100.0, 1e-6], &[100.0, 0.0], 1e-5).is_ok());
        let err = check_close(&[1.0, 2.5], &[1.0, 2.0], 1e-3).unwrap_err();
        assert!(err.contains("element 1"), "{err}");
    }

    #[test]
    fn sums_are_judged_against_their_addends() {
        // 3.0 + -2.953 = 0.047: an error of 1e-6 is 2e-5 of the result but 1.7e-7 of the addends.
        assert!(check_close_sum(&[0.047_001], &[3.0], &[-2.953], 1e-6).is_ok());
        assert!(check_close(&[0.047_001], &[0.047], 1e-6).is_err());
        assert!(check_close_sum(&[0.05], &[3.0], &[-2.953], 1e-5).is_err());
        assert!(check_close_sum(&[f32::NAN], &[0.0], &[0.0], 1.0).is_err());
        assert!(check_close_sum(&[1.0], &[1.0, 2.0], &[0.0], 1.0).is_err());
    }
}
