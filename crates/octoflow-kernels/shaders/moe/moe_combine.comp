#version 450
// The weighted sum of a token's expert outputs, added to the residual stream:
//   x[t * n_embd + d] += sum_j wt[t * n_used + j] * y[(t * n_used + j) * n_embd + d],
// j in increasing order (the CPU reference's order), for t < n_tokens, d < n_embd.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer Wt { float wt[]; };
layout(std430, binding = 2) buffer X { float x[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_used;
    uint n_embd;
} pc;

void main() {
    uint i = global_index();
    if (i >= pc.n_tokens * pc.n_embd) {
        return;
    }
    uint t = i / pc.n_embd;
    uint d = i % pc.n_embd;
    float s = 0.0;
    for (uint j = 0u; j < pc.n_used; j++) {
        uint p = t * pc.n_used + j;
        s += wt[p] * y[p * pc.n_embd + d];
    }
    x[i] += s;
}
