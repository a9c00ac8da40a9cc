#version 450
// LoRA shrink, f32 (lora.rs): t[tok, r] = s(tok, adapter_of(r)) * Σ_k a[r, k] * x[tok * x_stride + k]
// for r < r_total. One workgroup per (ROWS consecutive rank rows, token): its invocations stride
// over k (coalesced reads of x and of the A rows), each rank row is reduced over subgroups and
// shared memory. A row whose scale is exactly 0 is written as 0 without reading a (a workgroup
// whose rows all have scale 0 writes zeros and returns), so unused adapters cost nothing.
//
// adapter_of(r) is the a with offsets[a] <= r < offsets[a + 1] (offsets: nondecreasing prefix sums
// of the ranks, offsets[0] = 0, offsets[n_adapters] = r_total). The scale is
// scales[m * n_adapters + a] with m = mix[mix_offset + tok * mix_stride]; an m >= n_mix is
// clamped (the result is then unspecified, but nothing is read out of bounds).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#ifndef ROWS
#define ROWS 4u
#endif

layout(local_size_x = 128) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer T { float t[]; };
layout(std430, binding = 3) readonly buffer Off { uint offsets[]; };
layout(std430, binding = 4) readonly buffer S { float scales[]; };
layout(std430, binding = 5) readonly buffer M { uint mix_ids[]; };

layout(push_constant) uniform Push {
    uint r_total;
    uint n_in;
    uint n_adapters;
    uint n_mix;
    uint mix_offset;
    uint mix_stride;
    uint x_stride;
    uint n_tokens;
} pc;

// One slot per (row, subgroup); a subgroup has at least one invocation.
shared float part[ROWS * gl_WorkGroupSize.x];

// The adapter whose rank rows hold r: offsets[lo] <= r < offsets[lo + 1] (binary search; empty
// adapters, equal neighbouring offsets, are never returned).
uint adapter_of(uint r) {
    uint lo = 0u;
    uint hi = pc.n_adapters;
    while (hi - lo > 1u) {
        uint mid = (lo + hi) / 2u;
        if (offsets[mid] <= r) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

void main() {
    uint row0 = gl_WorkGroupID.x * ROWS;
    uint tok = gl_WorkGroupID.y;
    uint lid = gl_LocalInvocationID.x;
    uint m = min(mix_ids[pc.mix_offset + tok * pc.mix_stride], pc.n_mix - 1u);

    // Every invocation computes the same scales: the branches below are uniform.
    float s[ROWS];
    bool any_active = false;
    for (uint i = 0u; i < ROWS; i++) {
        uint r = row0 + i;
        s[i] = r < pc.r_total ? scales[m * pc.n_adapters + adapter_of(r)] : 0.0;
        any_active = any_active || s[i] != 0.0;
    }
    if (!any_active) {
        if (lid < ROWS && row0 + lid < pc.r_total) {
            t[tok * pc.r_total + row0 + lid] = 0.0;
        }
        return;
    }

    float acc[ROWS];
    for (uint i = 0u; i < ROWS; i++) {
        acc[i] = 0.0;
    }
    uint xb = tok * pc.x_stride;
    for (uint k = lid; k < pc.n_in; k += gl_WorkGroupSize.x) {
        float xv = x[xb + k];
        for (uint i = 0u; i < ROWS; i++) {
            if (s[i] != 0.0) {
                acc[i] += a[(row0 + i) * pc.n_in + k] * xv;
            }
        }
    }
    for (uint i = 0u; i < ROWS; i++) {
        float v = subgroupAdd(acc[i]);
        if (subgroupElect()) {
            part[i * gl_WorkGroupSize.x + gl_SubgroupID] = v;
        }
    }
    barrier();
    if (lid < ROWS && row0 + lid < pc.r_total) {
        float sum = 0.0;
        for (uint g = 0u; g < gl_NumSubgroups; g++) {
            sum += part[lid * gl_WorkGroupSize.x + g];
        }
        float sc = s[lid];
        t[tok * pc.r_total + row0 + lid] = sc == 0.0 ? 0.0 : sc * sum;
    }
}
