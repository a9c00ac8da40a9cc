#version 450
// Residual add, f32: c[i] = a[i] + b[i] for i < n. One invocation per element over a 2-D grid
// (see global_index in common.glsl).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer C { float c[]; };

layout(push_constant) uniform Push { uint n; } pc;

void main() {
    uint i = global_index();
    if (i < pc.n) {
        c[i] = a[i] + b[i];
    }
}
