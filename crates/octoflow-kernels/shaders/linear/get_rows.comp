#version 450
// Embedding lookup: out[i, :] = dequant(table row ids[ids_offset + i] - row_begin) * scale for
// i < n_ids whose id lies in [row_begin, row_end) (other ids are left alone: another piece of a
// split table holds them). The table holds rows row_begin..row_end in their GGUF encoding
// (quant.glsl, type from the QTYPE_* define), n_cols elements and row_bytes bytes each. out:
// [n_ids, n_cols] f32. One workgroup per id (2-D grid flattened as in common.glsl); invocations
// stride over the row's 32-element chunks.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer Ids { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Out { float outv[]; };

layout(push_constant) uniform Push {
    uint n_cols;
    uint row_bytes;
    uint row_begin;
    uint row_end;
    uint ids_offset;
    uint n_ids;
    float scale;
} pc;

#include "quant.glsl"

void main() {
    uint i = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (i >= pc.n_ids) {
        return;
    }
    uint id = ids[pc.ids_offset + i];
    if (id < pc.row_begin || id >= pc.row_end) {
        return;
    }
    uint rb = (id - pc.row_begin) * pc.row_bytes;
    uint nc = chunk_count(pc.n_cols);
    for (uint c = gl_LocalInvocationID.x; c < nc; c += gl_WorkGroupSize.x) {
        float v[32];
        dequant_chunk(rb, c, pc.n_cols, v);
        uint len = chunk_len(c, pc.n_cols);
        uint ob = i * pc.n_cols + 32u * c;
        for (uint k = 0u; k < len; k++) {
            outv[ob + k] = v[k] * pc.scale;
        }
    }
}
