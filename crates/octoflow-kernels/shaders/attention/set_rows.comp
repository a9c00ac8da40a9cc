#version 450
// Row scatter, f32 (KV-cache write): dst[pos[pos_offset] + t][c] = src[t][c] for t < n_rows,
// c < width; rows landing at or past dst_rows are skipped. Table mode: the row of t is
// PAGE_ROW(pos, pos[pos_offset + 2t + 1], pos[pos_offset + 2t]) (its position in its
// sequence's paged cache, page.glsl).
// One invocation per element.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"
#include "page.glsl"

layout(std430, binding = 0) readonly buffer S { float src[]; };
layout(std430, binding = 1) writeonly buffer D { float dst[]; };
layout(std430, binding = 2) readonly buffer P { uint pos[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint width;
    uint dst_rows;
    uint pos_offset;
    uint table;
} pc;

void main() {
    uint i = global_index();
    if (i >= pc.n_rows * pc.width) {
        return;
    }
    uint t = i / pc.width;
    uint c = i - t * pc.width;
    if (pc.table != 0u) {
        uint row = PAGE_ROW(pos, pos[pc.pos_offset + 2u * t + 1u], pos[pc.pos_offset + 2u * t], pc.dst_rows);
        if (row < pc.dst_rows) {
            dst[row * pc.width + c] = src[i];
        }
        return;
    }
    uint p = pos[pc.pos_offset];
    // p + t < dst_rows, written so that it cannot wrap around
    if (p < pc.dst_rows && t < pc.dst_rows - p) {
        dst[(p + t) * pc.width + c] = src[i];
    }
}
