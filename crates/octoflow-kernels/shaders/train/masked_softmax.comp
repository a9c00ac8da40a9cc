#version 450
// Masked softmax over attention scores [n_seq, n_head, seq_len (query i), seq_len (key j)] f32,
// forward and backward (push flag `backward`), one workgroup per row (s, h, i) on a 2-D grid.
//
// Row i of sequence s is at position p = pos[pos_offset + (s * seq_len + i) * pos_stride] of its
// document and sees keys lo <= j <= i, lo = i - min(p, i), raised to i + 1 - window when window > 0.
//
// forward  (binding 0 = x, in place): x[j] = exp(scale x[j] - m) / sum over visible j, m = the
//          visible max of scale x; invisible entries are written 0 (and never read).
// backward (binding 0 = p, binding 1 = dp, in place over dp): dp[j] = scale p[j] (dp[j] - D),
//          D = sum over visible j of p[j] dp[j]; invisible entries 0.
// In place is safe: the reduction loops' reads all happen before the barriers of wg_max/wg_sum,
// and the final loop reads and rewrites each element in one invocation.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

#include "reduce.glsl"

layout(std430, binding = 0) buffer A { float a[]; };
layout(std430, binding = 1) buffer B { float b[]; };
layout(std430, binding = 2) readonly buffer P { uint pos[]; };

layout(push_constant) uniform Push {
    uint n_rows; // n_seq * n_head * seq_len
    uint n_head;
    uint seq_len;
    uint pos_offset;
    uint pos_stride;
    uint window; // 0: none
    float scale;
    uint backward;
} pc;

void main() {
    uint row = flat_group();
    if (row >= pc.n_rows) {
        return; // whole workgroup: uniform
    }
    uint n = pc.seq_len;
    uint i = row % n;
    uint s = row / n / pc.n_head;
    uint p = pos[pc.pos_offset + (s * n + i) * pc.pos_stride];
    uint lo = i - min(p, i);
    if (pc.window > 0u && i - lo >= pc.window) {
        lo = i + 1u - pc.window;
    }
    uint base = row * n;
    uint lid = gl_LocalInvocationID.x;
    uint step = gl_WorkGroupSize.x;

    if (pc.backward == 0u) {
        float m = uintBitsToFloat(0xff800000u); // -inf
        for (uint j = lo + lid; j <= i; j += step) {
            m = max(m, pc.scale * a[base + j]);
        }
        m = wg_max(m);
        float sum = 0.0;
        for (uint j = lo + lid; j <= i; j += step) {
            sum += exp(pc.scale * a[base + j] - m);
        }
        float inv = 1.0 / wg_sum(sum);
        for (uint j = lid; j < n; j += step) {
            bool seen = j >= lo && j <= i;
            a[base + j] = seen ? exp(pc.scale * a[base + j] - m) * inv : 0.0;
        }
    } else {
        float d = 0.0;
        for (uint j = lo + lid; j <= i; j += step) {
            d += a[base + j] * b[base + j];
        }
        d = wg_sum(d);
        for (uint j = lid; j < n; j += step) {
            bool seen = j >= lo && j <= i;
            b[base + j] = seen ? pc.scale * a[base + j] * (b[base + j] - d) : 0.0;
        }
    }
}
