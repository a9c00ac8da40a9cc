#version 450
// Grouping a batch's (token, slot) pairs by expert, for the grouped expert products: one
// workgroup. From ids[p] (the expert of pair p = t * n_used + j, moe_route.comp's output) write
// offsets[e] = the pairs of experts below e, offsets[n_expert] = n_pairs, and list[offsets[e] ..
// offsets[e + 1]) = the pairs of expert e in increasing order: a stable counting sort, so the
// order (and every product's summation order) is the same in every run.
// The pairs are cut into S = WG / n_expert segments (1 where there are more experts than
// invocations); slot (e, s) = invocation e * S + s (and every WG-th after it) counts the pairs of
// expert e in segment s, then places them at the running position of its slot: a prefix sum
// over the slots in (expert, segment) order gives every slot its start, so the order within an
// expert is the pairs' order. Each slot reads its segment's ids (the S slots of a segment read
// the same words: cached), so a few experts still keep every invocation busy.
#extension GL_GOOGLE_include_directive : require

#define WG 256u
// Host-checked limit (moe/group.rs).
#define MAX_EXPERTS 1024u

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer Ids { uint ids[]; };
layout(std430, binding = 1) writeonly buffer Off { uint offsets[]; };
layout(std430, binding = 2) writeonly buffer List { uint list[]; };

layout(push_constant) uniform Push {
    uint n_pairs;
    uint n_expert;
} pc;

// Per slot: its pair count, then its first place in the list. Slots: n_expert * S, at most
// max(WG, MAX_EXPERTS).
shared uint cnt[MAX_EXPERTS];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint segs = pc.n_expert <= WG ? WG / pc.n_expert : 1u;
    uint seg_len = (pc.n_pairs + segs - 1u) / segs;
    uint slots = pc.n_expert * segs;
    for (uint slot = tid; slot < slots; slot += WG) {
        uint e = slot / segs;
        uint begin = (slot % segs) * seg_len;
        uint end = min(begin + seg_len, pc.n_pairs);
        uint c = 0u;
        for (uint p = begin; p < end; p++) {
            c += ids[p] == e ? 1u : 0u;
        }
        cnt[slot] = c;
    }
    barrier();
    if (tid == 0u) {
        uint off = 0u;
        for (uint slot = 0u; slot < slots; slot++) {
            if (slot % segs == 0u) {
                offsets[slot / segs] = off;
            }
            uint c = cnt[slot];
            cnt[slot] = off;
            off += c;
        }
        offsets[pc.n_expert] = off;
    }
    barrier();
    for (uint slot = tid; slot < slots; slot += WG) {
        uint e = slot / segs;
        uint begin = (slot % segs) * seg_len;
        uint end = min(begin + seg_len, pc.n_pairs);
        uint c = cnt[slot];
        for (uint p = begin; p < end; p++) {
            if (ids[p] == e) {
                list[c] = p;
                c++;
            }
        }
    }
}
