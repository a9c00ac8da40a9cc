#version 450
// x quantized once for the 8-bit integer dot products of matvec_dot.comp's XQ variants, which
// then copy it instead of quantizing x in every workgroup: token t (workgroup t) of x, times the
// norm weight g where `norm`, per block of 32 as q8.glsl, into one buffer of words —
//   codes   [n_tokens, n_cols / 4]                           from word 0
//   scales  [n_tokens, n_cols / 32] of (d, d * sum of codes)  from word n_tokens * n_cols / 4
//   inverse [n_tokens]: 1 / rms(x_t) with the norm, else 1    after the scales
// — the values the products would compute (the sum of squares summed in another order).
// n_cols is a multiple of 32.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

#include "common.glsl"
#include "reduce.glsl"

layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 1) readonly buffer G4 { vec4 g4[]; };
layout(std430, binding = 2) writeonly buffer XQ { uint xq[]; };
layout(std430, binding = 2) writeonly buffer XF { float xf[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_cols;
    float eps;
    uint norm; // 1: the input is rms_norm(x) * g
} pc;

#include "q8.glsl"

void main() {
    uint t = gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uint nb = pc.n_cols / 32u;
    uint xrow = pc.n_cols / 4u;
    uint sbase = pc.n_tokens * xrow;
    bool norm = pc.norm != 0u;
    float ss = 0.0;
    for (uint b = tid; b < nb; b += gl_WorkGroupSize.x) {
        vec4 v[8];
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            vec4 xv = x4[t * xrow + b * 8u + j];
            ss += dot(xv, xv);
            if (norm) {
                xv *= g4[b * 8u + j];
            }
            v[j] = xv;
        }
        vec2 s = q8_store(v, t * xrow + b * 8u);
        uint si = sbase + 2u * (t * nb + b);
        xf[si] = s.x;
        xf[si + 1u] = s.y;
    }
    float tot = wg_sum(ss);
    if (tid == 0u) {
        float inv = norm ? 1.0 / sqrt(tot / float(pc.n_cols) + pc.eps) : 1.0;
        xf[sbase + 2u * pc.n_tokens * nb + t] = inv;
    }
}
