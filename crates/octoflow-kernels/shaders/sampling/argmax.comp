#version 450
// Argmax of each row of logits: out[out_offset + r] = index of the largest value (first on ties,
// NaN never chosen, 0 when nothing beats -inf), exactly the CPU `argmax`.
//
// Grid (n_split, n_rows): workgroup (s, r) scans the s-th of n_split equal slices of row r. With
// n_split == 1 it writes the answer. Otherwise it writes its slice's best (value bits, index) to
// part[2 * (r * n_split + s)] and counts itself done on counts[r]; the workgroup that arrives
// last (no waiting: the others have written and left) merges the n_split candidates in slice
// order, writes the answer and puts counts[r] back to 0 for the next replay. One dependent stage
// for the whole vocabulary, instead of one workgroup scanning ~150k logits alone.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) writeonly buffer Out { uint outv[]; };
layout(std430, binding = 2) coherent buffer Part { uint part[]; };
layout(std430, binding = 3) coherent buffer Counts { uint counts[]; };

layout(push_constant) uniform Push {
    uint n_vocab;
    uint out_offset;
    uint n_split;
    uint slice; // logits per slice (the last may be shorter)
} pc;

#include "argmax.glsl"

shared bool am_last;

void main() {
    uint s = gl_WorkGroupID.x;
    uint row = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint begin = min(s * pc.slice, pc.n_vocab);
    uint len = min(pc.slice, pc.n_vocab - begin);
    row_base = row * pc.n_vocab + begin;
    uint local_best = workgroup_argmax(len);
    if (pc.n_split == 1u) {
        if (tid == 0u) {
            outv[pc.out_offset + row] = local_best;
        }
        return;
    }
    if (tid == 0u) {
        // An empty slice or one where nothing beats -inf offers (-inf, begin): never chosen
        // over an earlier candidate, and the merge starts from (-inf, 0).
        float v = len == 0u ? uintBitsToFloat(0xFF800000u) : logits[row_base + local_best];
        if (isnan(v)) {
            v = uintBitsToFloat(0xFF800000u);
        }
        uint slot = 2u * (row * pc.n_split + s);
        part[slot] = floatBitsToUint(v);
        part[slot + 1u] = begin + local_best;
        memoryBarrierBuffer();
        am_last = atomicAdd(counts[row], 1u) == pc.n_split - 1u;
        memoryBarrierBuffer();
    }
    barrier();
    if (!am_last) {
        return;
    }
    // The last workgroup: candidates in slice order, so on equal values the earlier slice (the
    // lower index) is kept; subgroup passes over up to 256 slices.
    float bv = uintBitsToFloat(0xFF800000u);
    uint bi = 0u;
    for (uint k = tid; k < pc.n_split; k += gl_WorkGroupSize.x) {
        uint slot = 2u * (row * pc.n_split + k);
        float v = uintBitsToFloat(part[slot]);
        uint i = part[slot + 1u];
        if (am_before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    float m = subgroupMax(bv);
    uint mi = subgroupMin(bv == m ? bi : 0xFFFFFFFFu);
    if (subgroupElect()) {
        am_val[gl_SubgroupID] = m;
        am_idx[gl_SubgroupID] = mi;
    }
    barrier();
    if (tid == 0u) {
        float best_v = uintBitsToFloat(0xFF800000u);
        uint best_i = 0u;
        for (uint g = 0u; g < gl_NumSubgroups; ++g) {
            if (am_before(am_val[g], am_idx[g], best_v, best_i)) {
                best_v = am_val[g];
                best_i = am_idx[g];
            }
        }
        outv[pc.out_offset + row] = best_i;
        counts[row] = 0u;
    }
}
