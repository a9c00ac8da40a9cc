#version 450
// RMSNorm, f32: o[r][i] = x[r][i] / sqrt(mean_i(x[r]^2) + eps) * w[i]. One workgroup per row
// (2-D grid of rows); x and o may be the same memory (each invocation rewrites what it read).
// ADD variant (rms_norm_add): o[r][i] = res[r][i] + the same, a post-norm and its residual add
// in one dispatch (o must not alias x; res may be o itself, each invocation reading what it
// writes).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

#include "reduce.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
#ifdef ADD
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(std430, binding = 3) readonly buffer Res { float res[]; };
#else
layout(std430, binding = 2) writeonly buffer O { float o[]; };
#endif

layout(push_constant) uniform Push { uint n_rows; uint n; float eps; } pc;

void main() {
    uint row = flat_group();
    if (row >= pc.n_rows) {
        return; // whole workgroup: uniform
    }
    uint base = row * pc.n;
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
        float v = x[base + i];
        ss += v * v;
    }
    ss = wg_sum(ss);
    float scale = 1.0 / sqrt(ss / float(pc.n) + pc.eps);
    for (uint i = gl_LocalInvocationID.x; i < pc.n; i += gl_WorkGroupSize.x) {
#ifdef ADD
        o[base + i] = res[base + i] + x[base + i] * scale * w[i];
#else
        o[base + i] = x[base + i] * scale * w[i];
#endif
    }
}
