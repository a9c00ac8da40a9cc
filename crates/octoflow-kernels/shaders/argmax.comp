#version 450
// Argmax of each row of logits (one workgroup per row r): out[out_offset + r] = index of the largest value (first on ties, NaN
// never chosen, 0 when nothing beats -inf), exactly the CPU `argmax`. One workgroup scans the row.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) writeonly buffer Out { uint outv[]; };

layout(push_constant) uniform Push { uint n_vocab; uint out_offset; } pc;

#include "argmax.glsl"

void main() {
    uint row = gl_WorkGroupID.x;
    row_base = row * pc.n_vocab;
    uint best = workgroup_argmax(pc.n_vocab);
    if (gl_LocalInvocationID.x == 0u) {
        outv[pc.out_offset + row] = best;
    }
}
