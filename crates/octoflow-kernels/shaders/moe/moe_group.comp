#version 450
// Grouping a batch's (token, slot) pairs by expert, for the grouped expert products: one
// workgroup. From ids[p] (the expert of pair p = t * n_used + j, moe_route.comp's output) write
// offsets[e] = the pairs of experts below e, offsets[n_expert] = n_pairs, and list[offsets[e] ..
// offsets[e + 1]) = the pairs of expert e in increasing order: a stable counting sort, so the
// order (and every product's summation order) is the same in every run.
// Invocation i owns experts i, i + WG, ...: it counts and places their pairs alone, scanning
// the ids through shared memory a tile at a time (every invocation reads the same word: a
// broadcast). Two scans: counts, then (after a serial prefix sum over the experts) placement.
#extension GL_GOOGLE_include_directive : require

#define WG 256u
#define TILE 2048u
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

shared uint tile[TILE];
shared uint cnt[MAX_EXPERTS];

// One scan over every pair: counts (place false) or writes each owned expert's pairs at its
// running position cnt[e] (place true).
void scan(uint tid, bool place) {
    for (uint base = 0u; base < pc.n_pairs; base += TILE) {
        uint len = min(TILE, pc.n_pairs - base);
        barrier(); // the last tile's reads are done
        for (uint i = tid; i < len; i += WG) {
            tile[i] = ids[base + i];
        }
        barrier();
        for (uint e = tid; e < pc.n_expert; e += WG) {
            uint c = cnt[e];
            for (uint i = 0u; i < len; i++) {
                if (tile[i] == e) {
                    if (place) {
                        list[c] = base + i;
                    }
                    c++;
                }
            }
            cnt[e] = c;
        }
    }
    barrier();
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    for (uint e = tid; e < pc.n_expert; e += WG) {
        cnt[e] = 0u;
    }
    scan(tid, false);
    if (tid == 0u) {
        uint off = 0u;
        for (uint e = 0u; e < pc.n_expert; e++) {
            uint c = cnt[e];
            offsets[e] = off;
            cnt[e] = off;
            off += c;
        }
        offsets[pc.n_expert] = off;
    }
    barrier();
    scan(tid, true);
}
