// The RoPE angle, shared by rope.comp, rope_store.comp and attention_decode.comp (FRESH): cos and
// sin of theta_i = p * f_i, times mscale, where f_i is pair i's frequency in radians per
// position, computed by the host in f64 (base, linear scale, rope_freqs divisors and YaRN's blend
// all folded in: one place for that math) and handed over as a double-float vec2(hi, lo) table.
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

// vec2(cos, sin) of theta = c * p for a double-float frequency c (radians per position)
vec2 rope_cos_sin_freq(vec2 c, uint p) {
    vec2 theta = dd_mul_f(c, float(p));
    vec2 turns = dd_mul(theta, vec2(uintBitsToFloat(0x3e22f983u), uintBitsToFloat(0x31dc9c88u)));
    precise float f = (turns.x - floor(turns.x)) + turns.y;
    f = f - round(f); // [-1/2, 1/2]
    float ang = f * 6.2831853;
    return vec2(cos(ang), sin(ang));
}

// mscale * vec2(cos, sin) of theta = f * p for pair frequency f (double-float radians per
// position; the per-pair table every RoPE kernel binds) at position p (exact below 2^24)
vec2 rope_cos_sin(vec2 f, uint p, float mscale) {
    return mscale * rope_cos_sin_freq(f, p);
}
