#version 450
// LoRA expand, f32 (lora.rs): y[tok * y_stride + y_col + j] += Σ_r b[j, r] * t[tok, r] for
// j < n_out, where the sum skips the rank rows of every adapter whose scale for that token is 0
// (their b columns are not read by a workgroup none of whose tokens uses the adapter).
//
// One workgroup per (JB output columns, TOKS tokens); invocation (jj, tk) = (lid % JB, lid / JB)
// owns one output element. The workgroup's t rows are staged in shared memory (r_total <= 256,
// checked by the host), then for each adapter used by any of its tokens, b is staged RC rank
// columns at a time (rows of RC contiguous floats: coalesced) and every invocation whose token
// uses the adapter accumulates. Scales and mix ids: as in lora_shrink.comp.
#extension GL_GOOGLE_include_directive : require

#ifndef JB
#define JB 64u
#endif
#ifndef TOKS
#define TOKS 4u
#endif
#ifndef RC
#define RC 16u
#endif
#define MAX_RANK 256u

layout(local_size_x = 256) in; // JB * TOKS

#include "common.glsl"

layout(std430, binding = 0) readonly buffer B { float b[]; };
layout(std430, binding = 1) readonly buffer T { float t[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Off { uint offsets[]; };
layout(std430, binding = 4) readonly buffer S { float scales[]; };
layout(std430, binding = 5) readonly buffer M { uint mix_ids[]; };

layout(push_constant) uniform Push {
    uint r_total;
    uint n_out;
    uint n_adapters;
    uint n_mix;
    uint mix_offset;
    uint mix_stride;
    uint y_stride;
    uint y_col;
    uint n_tokens;
} pc;

shared float ts[TOKS * MAX_RANK];
shared float bs[JB * (RC + 1u)]; // padded rows: no bank conflicts when jj varies

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint jj = lid % JB;
    uint tk = lid / JB;
    uint j0 = gl_WorkGroupID.x * JB;
    uint tok0 = gl_WorkGroupID.y * TOKS;
    uint j = j0 + jj;
    uint tok = tok0 + tk;

    for (uint i = lid; i < TOKS * pc.r_total; i += gl_WorkGroupSize.x) {
        uint k = i / pc.r_total;
        uint r = i - k * pc.r_total;
        ts[k * MAX_RANK + r] = tok0 + k < pc.n_tokens ? t[(tok0 + k) * pc.r_total + r] : 0.0;
    }
    // The scale rows (mix ids) of the workgroup's tokens, the same in every invocation.
    uint mrow[TOKS];
    for (uint k = 0u; k < TOKS; k++) {
        uint tt = min(tok0 + k, pc.n_tokens - 1u);
        mrow[k] = min(mix_ids[pc.mix_offset + tt * pc.mix_stride], pc.n_mix - 1u) * pc.n_adapters;
    }
    barrier();

    float acc = 0.0;
    for (uint ad = 0u; ad < pc.n_adapters; ad++) {
        uint lo = offsets[ad];
        uint hi = offsets[ad + 1u];
        bool any_active = false;
        bool mine = false;
        for (uint k = 0u; k < TOKS; k++) {
            bool act = tok0 + k < pc.n_tokens && scales[mrow[k] + ad] != 0.0;
            any_active = any_active || act;
            mine = mine || (k == tk && act);
        }
        if (!any_active || hi <= lo) {
            continue; // uniform
        }
        for (uint c = lo; c < hi; c += RC) {
            uint len = min(RC, hi - c);
            for (uint i = lid; i < JB * RC; i += gl_WorkGroupSize.x) {
                uint q = i / RC;
                uint rr = i - q * RC;
                bool inside = rr < len && j0 + q < pc.n_out;
                bs[q * (RC + 1u) + rr] = inside ? b[(j0 + q) * pc.r_total + c + rr] : 0.0;
            }
            barrier();
            if (mine) {
                for (uint rr = 0u; rr < len; rr++) {
                    acc += bs[jj * (RC + 1u) + rr] * ts[tk * MAX_RANK + c + rr];
                }
            }
            barrier();
        }
    }
    if (j < pc.n_out && tok < pc.n_tokens) {
        uint o = tok * pc.y_stride + pc.y_col + j;
        y[o] += acc;
    }
}
