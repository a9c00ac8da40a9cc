//! Test helper: central finite differences, which check each backward reference against the
//! forward reference it differentiates.

/// The gradient of `loss` at `x` by central differences in f64: per element, the quotient
/// `(L(x + h) - L(x - h)) / (step actually taken after f32 rounding of x ± h)` at steps `h` and
/// `h/2`, combined by Richardson extrapolation `(4 D(h/2) - D(h)) / 3`, which cancels the `h^2`
/// error term (the forward references round to f32, so `h` cannot be made tiny instead).
pub fn central_difference(x: &[f32], h: f32, loss: impl Fn(&[f32]) -> f64) -> Vec<f32> {
    let mut xp = x.to_vec();
    let mut quotient = |i: usize, h: f32| {
        let (hi, lo) = (x[i] + h, x[i] - h);
        xp[i] = hi;
        let up = loss(&xp);
        xp[i] = lo;
        let down = loss(&xp);
        xp[i] = x[i];
        (up - down) / (f64::from(hi) - f64::from(lo))
    };
    (0..x.len())
        .map(|i| ((4.0 * quotient(i, h / 2.0) - quotient(i, h)) / 3.0) as f32)
        .collect()
}

/// `sum_i a[i] * b[i]` in f64: the scalar loss `L = dy . y` whose gradient a backward computes.
pub fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}
