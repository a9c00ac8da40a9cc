#version 450
// Rotary position embedding, f32, in place on x [n_tokens, n_heads, head_dim]. One invocation
// per rotated pair: pair i < n_rot/2 of head (t, h) is (2i, 2i+1) (normal) or (i, i + n_rot/2)
// (neox), rotated by theta_i = p * scale * r^i / ff[i] (by -theta_i when `inverse`: the transpose,
// RoPE's backward) with p = pos[pos_offset] + t (table mode: pos[pos_offset + 2t]) and
// r = base^(-2/n_rot) (given by the host in double-float). Dims >= n_rot are not touched.
//
// Accuracy: theta reaches ~3e4 rad, where an f32 angle is off by ~1e-3. The angle is computed
// in double-float (pairs of f32, ~44 bits), reduced to a fraction of a turn in [-1/2, 1/2] and
// only then turned into radians for f32 sin/cos, whose argument is now within [-pi, pi].
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer P { uint pos[]; };
layout(std430, binding = 2) readonly buffer F { float ff[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_heads;
    uint head_dim;
    uint n_rot;
    uint neox;
    uint has_ff;
    uint pos_offset;
    float scale;
    float r_hi;
    float r_lo;
    uint table; // 1: token t at pos[pos_offset + 2t] (per-token (position, row) pairs)
    uint inverse; // 1: rotate by -theta (the transpose: RoPE's backward)
} pc;

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

void main() {
    uint half_rot = pc.n_rot / 2u;
    uint idx = global_index();
    if (idx >= pc.n_tokens * pc.n_heads * half_rot) {
        return;
    }
    uint i = idx % half_rot;
    uint head = idx / half_rot; // t * n_heads + h
    uint t = head / pc.n_heads;
    uint p = pc.table != 0u ? pos[pc.pos_offset + 2u * t] : pos[pc.pos_offset] + t;

    // c = r^i by binary powering
    vec2 c = vec2(1.0, 0.0);
    vec2 b = vec2(pc.r_hi, pc.r_lo);
    for (uint e = i; e != 0u; e >>= 1) {
        if ((e & 1u) != 0u) {
            c = dd_mul(c, b);
        }
        b = dd_mul(b, b);
    }
    c = dd_mul_f(c, pc.scale);
    if (pc.has_ff != 0u) {
        c = dd_div_f(c, ff[i]);
    }
    // float(p) is exact for p < 2^24
    vec2 theta = dd_mul_f(c, float(p));
    vec2 turns = dd_mul(theta, vec2(uintBitsToFloat(0x3e22f983u), uintBitsToFloat(0x31dc9c88u)));
    precise float f = (turns.x - floor(turns.x)) + turns.y;
    f = f - round(f); // [-1/2, 1/2]
    float ang = f * 6.2831853;
    float cs = cos(ang);
    float sn = pc.inverse != 0u ? -sin(ang) : sin(ang);

    uint base = head * pc.head_dim;
    uint a = pc.neox != 0u ? base + i : base + 2u * i;
    uint bi = pc.neox != 0u ? a + half_rot : a + 1u;
    float x0 = x[a];
    float x1 = x[bi];
    x[a] = x0 * cs - x1 * sn;
    x[bi] = x0 * sn + x1 * cs;
}
