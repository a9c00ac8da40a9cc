#version 450
// RMSNorm backward, f32. Forward: y[r][k] = x[r][k] * s * w[k] with s = 1/sqrt(mean(x[r]^2) + eps).
// Given dy, writes (or adds to, `accumulate`) dx[r][k] = s * (w[k] dy[k] - x[k] * s^2 * D / n) with
// D = sum_i w[i] dy[i] x[i]. One workgroup per row (2-D grid of rows); both sums in one pass. dx may
// be the same memory as dy when not accumulating (each invocation rewrites the elements it read).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

#include "reduce.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer DY { float dy[]; };
layout(std430, binding = 3) buffer DX { float dx[]; };

layout(push_constant) uniform Push { uint n_rows; uint n; float eps; uint accumulate; } pc;

void main() {
    uint row = flat_group();
    if (row >= pc.n_rows) {
        return; // whole workgroup: uniform
    }
    uint base = row * pc.n;
    float ss = 0.0;
    float d = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
        float v = x[base + i];
        ss += v * v;
        d += w[i] * dy[base + i] * v;
    }
    ss = wg_sum(ss);
    d = wg_sum(d);
    float s = 1.0 / sqrt(ss / float(pc.n) + pc.eps);
    float c = s * s * d / float(pc.n);
    for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
        float g = s * (w[i] * dy[base + i] - x[base + i] * c);
        dx[base + i] = pc.accumulate != 0u ? dx[base + i] + g : g;
    }
}
