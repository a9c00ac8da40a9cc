#version 450
// Row softmax, f32: o[r] = softmax(scale * x[r]), max-subtracted. One workgroup per row (2-D
// grid of rows); x and o may be the same memory (each invocation rewrites what it read).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

#include "reduce.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };

layout(push_constant) uniform Push { uint n_rows; uint n; float scale; } pc;

void main() {
    uint row = flat_group();
    if (row >= pc.n_rows) {
        return; // whole workgroup: uniform
    }
    uint base = row * pc.n;
    float m = uintBitsToFloat(0xff800000u); // -inf
    for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
        m = max(m, pc.scale * x[base + i]);
    }
    m = wg_max(m);
    float s = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
        s += exp(pc.scale * x[base + i] - m);
    }
    float inv = 1.0 / wg_sum(s);
    for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
        o[base + i] = exp(pc.scale * x[base + i] - m) * inv;
    }
}
