#version 450
// The sum of split-K pieces (see matmul_coop.comp): for t < n_tokens, r < n_rows,
//   y[t * y_stride + y_col + r] (= | +=) sum over p < split of part[(p * n_tokens + t) * n_rows + r]
//                                       (+ bias[r]),
// the pieces added in order. One invocation per output.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer Part { float part[]; };
layout(std430, binding = 1) buffer Y { float y[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_tokens;
    uint split;
    uint y_stride;
    uint y_col;
    uint flags; // bit 0: add bias, bit 1: accumulate into y
} pc;

void main() {
    uint i = global_index();
    if (i >= pc.n_rows * pc.n_tokens) {
        return;
    }
    uint t = i / pc.n_rows;
    uint r = i - t * pc.n_rows;
    float s = 0.0;
    for (uint p = 0u; p < pc.split; p++) {
        s += part[(p * pc.n_tokens + t) * pc.n_rows + r];
    }
    if ((pc.flags & 1u) != 0u) {
        s += bias[r];
    }
    uint o = t * pc.y_stride + pc.y_col + r;
    if ((pc.flags & 2u) != 0u) {
        s += y[o];
    }
    y[o] = s;
}
