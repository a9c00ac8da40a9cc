//! The scale searches of ggml's reference K-quant quantizers (`make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants` in `ggml-quants.c`), reimplemented.
//!
//! Bit-exactness with ggml depends on doing every f32 operation in the same order, so the sums
//! below are sequential on purpose (no reassociation, no fused multiply-add).

/// Groups whose largest magnitude is below this are treated as all zero (`GROUP_MAX_EPS`).
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, via the float trick ggml uses: adding 1.5·2^23 puts the
/// integer part in the low mantissa bits. Exact for |v| ≤ 2^22 − 1; outside that range (and for
/// NaN) it returns the same wrapped garbage as ggml, which callers then clamp.
#[inline(always)]
pub(super) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// The value with the largest magnitude (the first one on ties) and that magnitude.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// `make_qx_quants` with `rmse_type = 1` and no importance weights (weights `x²`): a symmetric
/// scale for codes in `[-nmax, nmax)`, chosen among 19 candidates to maximize `sumlx²/suml2`.
/// Writes codes offset by `nmax` (so `0..2*nmax`) into `codes` and returns the scale.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], codes: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let l = quant(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let fill = |iscale: f32, codes: &mut [i8]| {
        for (c, &v) in codes.iter_mut().zip(x) {
            *c = (nmax + quant(iscale, v)) as i8;
        }
    };

    let iscale = -(nmax as f32) / max;
    fill(iscale, codes);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fill(iscale, codes);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` with `do_rmse`: a symmetric scale for codes in `[-nmax, nmax)` refined by up
/// to 5 passes of per-element code changes that raise `sumlx²/suml2` (weights `x²`). Writes
/// codes offset by `nmax` into `codes` and returns the scale.
pub(super) fn make_q3_quants(nmax: i32, x: &[f32], codes: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        codes.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (c, &v) in codes.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *c = l as i8;
        let w = v * v;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (c, &v) in codes.iter_mut().zip(x) {
            let w = v * v;
            let l = *c as f32;
            let mut slx = sumlx - w * v * l;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * l * l;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *c as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *c = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for c in codes.iter_mut() {
        *c += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The search parameters of [`make_qkx2_quants`]: candidate inverse scales are
/// `(nmax + rmin + rdelta*i) / (max - min)` for `i` in `0..=nstep`; `use_mad` weighs absolute
/// instead of squared errors.
pub(super) struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    pub use_mad: bool,
}

/// `make_qkx2_quants`: an affine fit `x ≈ scale*L - min_offset` with codes `L` in `0..=nmax`
/// and `min_offset ≥ 0`, minimizing the weighted error over the candidate scales (each refined
/// by weighted least squares). Writes the codes and returns `(scale, min_offset)`.
pub(super) fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    codes: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = if x[i] < min { x[i] } else { min };
        max = if x[i] > max { x[i] } else { max };
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        codes.fill(0);
        return (0.0, -min);
    }
    let nmax = p.nmax as f32;
    // Candidates after an improvement measure from the improved `min`, as in ggml.
    let code =
        |iscale: f32, min: f32, v: f32| nearest_int(iscale * (v - min)).clamp(0, p.nmax) as u8;
    let error = |scale: f32, min: f32, codes: &[u8]| {
        let mut e = 0f32;
        for i in 0..n {
            let diff = scale * codes[i] as f32 + min - x[i];
            e += weights[i] * if p.use_mad { diff.abs() } else { diff * diff };
        }
        e
    };

    let iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = code(iscale, min, v);
    }
    let mut best_error = error(scale, min, codes);
    let mut aux = [0u8; 32];
    let aux = &mut aux[..n];
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + nmax) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            aux[i] = code(iscale, min, x[i]);
            let (l, w) = (aux[i] as f32, weights[i]);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let cur_error = error(this_scale, this_min, aux);
            if cur_error < best_error {
                codes.copy_from_slice(aux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}
