// The RoPE angle, shared by rope.comp and rope_store.comp: cos and sin of
// theta_i = p * scale * r^i / ff_i, r = base^(-2/n_rot) given by the host in double-float.
//
// Accuracy: theta reaches ~3e4 rad, where an f32 angle is off by ~1e-3. The angle is computed
// in double-float (pairs of f32, ~44 bits), reduced to a fraction of a turn in [-1/2, 1/2] and
// only then turned into radians for f32 sin/cos, whose argument is now within [-pi, pi].

// Double-float helpers: vec2(hi, lo) with |lo| <= ulp(hi)/2. `precise` forbids contraction and
// reassociation, which would break the error-free transformations.
vec2 quick_two_sum(float a, float b) {
    precise float s = a + b;
    precise float e = b - (s - a);
    return vec2(s, e);
}

vec2 split(float a) {
    precise float t = 4097.0 * a;
    precise float hi = t - (t - a);
    precise float lo = a - hi;
    return vec2(hi, lo);
}

vec2 two_prod(float a, float b) {
    precise float p = a * b;
    vec2 sa = split(a);
    vec2 sb = split(b);
    precise float e = ((sa.x * sb.x - p) + sa.x * sb.y + sa.y * sb.x) + sa.y * sb.y;
    return vec2(p, e);
}

vec2 dd_mul(vec2 a, vec2 b) {
    vec2 p = two_prod(a.x, b.x);
    precise float lo = p.y + (a.x * b.y + a.y * b.x);
    return quick_two_sum(p.x, lo);
}

vec2 dd_mul_f(vec2 a, float b) {
    vec2 p = two_prod(a.x, b);
    precise float lo = p.y + a.y * b;
    return quick_two_sum(p.x, lo);
}

vec2 dd_div_f(vec2 a, float b) {
    precise float q1 = a.x / b;
    vec2 r = two_prod(q1, b);
    precise float rem = ((a.x - r.x) - r.y) + a.y;
    precise float q2 = rem / b;
    return quick_two_sum(q1, q2);
}

// vec2(cos, sin) of theta = c * p for a double-float frequency c (radians per position)
vec2 rope_cos_sin_freq(vec2 c, uint p) {
    vec2 theta = dd_mul_f(c, float(p));
    vec2 turns = dd_mul(theta, vec2(uintBitsToFloat(0x3e22f983u), uintBitsToFloat(0x31dc9c88u)));
    precise float f = (turns.x - floor(turns.x)) + turns.y;
    f = f - round(f); // [-1/2, 1/2]
    float ang = f * 6.2831853;
    return vec2(cos(ang), sin(ang));
}

// vec2(cos, sin) of theta_i at position p (exact as a float below 2^24); r = vec2(r_hi, r_lo);
// the frequency is divided by ff_i only when has_ff.
vec2 rope_cos_sin(uint i, uint p, vec2 r, float scale, bool has_ff, float ff_i) {
    // c = r^i by binary powering
    vec2 c = vec2(1.0, 0.0);
    vec2 b = r;
    for (uint e = i; e != 0u; e >>= 1) {
        if ((e & 1u) != 0u) {
            c = dd_mul(c, b);
        }
        b = dd_mul(b, b);
    }
    c = dd_mul_f(c, scale);
    if (has_ff) {
        c = dd_div_f(c, ff_i);
    }
    return rope_cos_sin_freq(c, p);
}

