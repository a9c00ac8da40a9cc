#version 450
// Token ids of a batched step: out[r] = src[r] when its top bit is clear, else
// prev[src[r] & 0x7fffffff] (a token the previous step sampled on the device), r < n.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer S { uint src[]; };
layout(std430, binding = 1) readonly buffer P { uint prev[]; };
layout(std430, binding = 2) writeonly buffer O { uint outv[]; };

layout(push_constant) uniform Push { uint n; uint n_prev; } pc;

void main() {
    uint r = global_index();
    if (r >= pc.n) {
        return;
    }
    uint s = src[r];
    if ((s & 0x80000000u) != 0u) {
        uint i = s & 0x7FFFFFFFu;
        // an index past prev gives id 0 rather than a stray read
        s = i < pc.n_prev ? prev[i] : 0u;
    }
    outv[r] = s;
}
