#version 450
// Sum of squares, f32: out[out_offset] = sum over i < n of x[i]^2, computed by ONE workgroup in a
// fixed order, so the result is bit-identical on every run of the same device (no atomics, no
// subgroup operations whose order the driver picks):
//   1. invocation t sums x[t], x[t + 256], x[t + 512], ... in index order with Kahan
//      compensation (`precise` keeps the compiler from reassociating it away);
//   2. the 256 partial sums are added by a pairwise tree in shared memory (halving strides).
// The loads of one step are 256 consecutive floats (coalesced); eight steps are loaded before
// they are added so several loads are in flight per invocation.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) buffer Out { float out_buf[]; };

layout(push_constant) uniform Push {
    uint n;
    uint out_offset;
} pc;

shared float partial[256];

// Kahan step on the locals `sum` and `comp` (the low part lost by the last addition).
#define KAHAN_ADD(v)                        \
    {                                       \
        precise float y_ = (v) - comp;      \
        precise float t_ = sum + y_;        \
        comp = (t_ - sum) - y_;             \
        sum = t_;                           \
    }

void main() {
    const uint L = 256u;
    uint tid = gl_LocalInvocationID.x;
    uint n = pc.n;
    uint i = tid;
    precise float sum = 0.0;
    precise float comp = 0.0;
    // Eight strides per step while all eight are in range (eight loads in flight per
    // invocation before the dependent Kahan chain), then the tail one stride at a time.
    while (n >= 7u * L && i < n - 7u * L) {
        float v[8];
        for (uint k = 0u; k < 8u; k++) {
            v[k] = x[i + k * L];
        }
        for (uint k = 0u; k < 8u; k++) {
            KAHAN_ADD(v[k] * v[k]);
        }
        i += 8u * L;
    }
    while (i < n) {
        float a = x[i];
        KAHAN_ADD(a * a);
        i += L;
    }
    partial[tid] = sum;
    barrier();
    for (uint stride = L / 2u; stride > 0u; stride >>= 1u) {
        if (tid < stride) {
            partial[tid] = partial[tid] + partial[tid + stride];
        }
        barrier();
    }
    if (tid == 0u) {
        out_buf[pc.out_offset] = partial[0];
    }
}
