#version 450
// Expert products of a few tokens (decode): for each (token, slot) pair p < n_pairs, the
// product with the rows of the expert the pair was routed to, ids[p], and nothing else:
//   y[p * n_rows + r] = dot(W_e row r, x[p / x_div]) (+ bias[e * n_rows + r]),  e = ids[p].
// W: the experts [e_begin, e_begin + e_count) of a stacked GGUF tensor, each n_rows rows of
// row_bytes bytes (quant.glsl; a tensor larger than one binding is bound in pieces of whole
// experts, one dispatch each, and a pair whose expert lies in another piece is left to that
// piece's dispatch). x_div is the pairs per input row: n_used where every slot of a token reads
// the token's normed input (gate, up), 1 where each pair has its own (down).
// GLU variants (GLU defined): the gate (binding 0) and up (binding 5, same type and shape)
// products of the same rows, each with its bias (3, 6), and y = moe_act(gate, up) (moe_act.glsl).
// Workgroup (x, y) = (ROWS rows, pair p). TPR invocations per row stride over its 32-element
// chunks (consecutive invocations, consecutive blocks), each chunk of x read once for both
// matrices; the row's partial sums meet in shared memory (no assumption on the subgroup size).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

#define QWINDOW 1 // unrolled chunk fetch and decode (quant.glsl)

#define TPR 32u
#define ROWS 4u
#define WG (TPR * ROWS)

layout(local_size_x = 128) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) readonly buffer Ids { uint ids[]; };
#ifdef GLU
layout(std430, binding = 5) readonly buffer W2 { uint w2[]; };
layout(std430, binding = 6) readonly buffer Bias2 { float bias2[]; };
#endif

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint row_bytes;
    uint n_pairs;
    uint x_div;
    uint e_begin;
    uint e_count;
    uint flags; // bit 0: add the biases
    uint act;   // GLU: moe_act.glsl's op
    float alpha;
    float limit;
} pc;

#include "quant.glsl"
#ifdef GLU
#define QSECOND
#include "quant.glsl" // dequant_chunk_2 reads w2
#undef QSECOND
#include "moe_act.glsl"
#define NMAT 2u
#else
#define NMAT 1u
#endif

shared float part[NMAT * WG];

void main() {
    uint p = gl_WorkGroupID.y;
    if (p >= pc.n_pairs) {
        return;
    }
    uint e = ids[p];
    if (e < pc.e_begin || e - pc.e_begin >= pc.e_count) {
        return; // the whole workgroup: another piece's expert
    }
    uint tid = gl_LocalInvocationID.x;
    uint lr = tid / TPR;
    uint lane = tid % TPR;
    uint r = gl_WorkGroupID.x * ROWS + lr;
    uint base = (e - pc.e_begin) * pc.n_rows * pc.row_bytes;
    uint xb = (p / pc.x_div) * pc.n_cols;
    bool xvec = (pc.n_cols & 3u) == 0u;

    float acc = 0.0;
    float acc2 = 0.0;
    if (r < pc.n_rows) {
        uint rb = base + r * pc.row_bytes;
        uint nc = chunk_count(pc.n_cols);
        for (uint c = lane; c < nc; c += TPR) {
            uint len = chunk_len(c, pc.n_cols);
            float v[32];
            dequant_chunk(rb, c, pc.n_cols, v);
#ifdef GLU
            float v2[32];
            dequant_chunk_2(rb, c, pc.n_cols, v2);
#endif
            if (len == 32u && xvec) {
                [[unroll]] for (uint i = 0u; i < 8u; i++) {
                    vec4 xv = x4[((xb + 32u * c) >> 2) + i];
                    acc += dot(vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]), xv);
#ifdef GLU
                    acc2 += dot(vec4(v2[4u * i], v2[4u * i + 1u], v2[4u * i + 2u], v2[4u * i + 3u]), xv);
#endif
                }
            } else {
                for (uint i = 0u; i < len; i++) {
                    float xv = x[xb + 32u * c + i];
                    acc += v[i] * xv;
#ifdef GLU
                    acc2 += v2[i] * xv;
#endif
                }
            }
        }
    }
    part[tid] = acc;
#ifdef GLU
    part[WG + tid] = acc2;
#endif
    barrier();
    if (lane == 0u && r < pc.n_rows) {
        float s = 0.0;
        float s2 = 0.0;
        for (uint j = 0u; j < TPR; j++) {
            s += part[tid + j];
#ifdef GLU
            s2 += part[WG + tid + j];
#endif
        }
        bool add_bias = (pc.flags & 1u) != 0u;
        if (add_bias) {
            s += bias[e * pc.n_rows + r];
        }
#ifdef GLU
        if (add_bias) {
            s2 += bias2[e * pc.n_rows + r];
        }
        y[p * pc.n_rows + r] = moe_act(s, s2, pc.act, pc.alpha, pc.limit);
#else
        y[p * pc.n_rows + r] = s;
#endif
    }
}
