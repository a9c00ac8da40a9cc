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
// COMBINE variants (plain products of one input row per pair, the down projection): the pairs
// of a token t go into the residual stream at once, as moe_combine.comp adds them —
//   y[t * n_rows + r] += sum_j wt[p] * (dot(W_e row r, x[p]) (+ bias)),  p = t * n_used + j,
// j in increasing order — with y (binding 2) the stream and the pairs' weights at binding 5;
// the host binds the whole tensor as one piece. Workgroup (x, y) = (ROWS rows, token t); each
// invocation keeps a partial sum per pair (at most MAX_USED), so every pair's loads are in
// flight together.
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
#ifdef COMBINE
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 5) readonly buffer Wt { float wt[]; };
#define MAX_USED 8u
#else
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
#endif
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
    uint n_used; // COMBINE: pairs per token
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

#ifdef COMBINE
shared float part[MAX_USED * WG];

void main() {
    uint t = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint lr = tid / TPR;
    uint lane = tid % TPR;
    uint r = gl_WorkGroupID.x * ROWS + lr;
    uint nu = pc.n_used;
    bool xvec = (pc.n_cols & 3u) == 0u;
    float acc[MAX_USED];
    uint rb[MAX_USED];
    [[unroll]] for (uint j = 0u; j < MAX_USED; j++) {
        acc[j] = 0.0;
        // rows past the end and slots past n_used read row 0 of the first pair (not summed)
        uint p = t * nu + min(j, nu - 1u);
        uint e = ids[p] - pc.e_begin;
        rb[j] = (e * pc.n_rows + min(r, pc.n_rows - 1u)) * pc.row_bytes;
    }
    uint nc = chunk_count(pc.n_cols);
    for (uint c = lane; c < nc; c += TPR) {
        uint len = chunk_len(c, pc.n_cols);
        [[unroll]] for (uint j = 0u; j < MAX_USED; j++) {
            if (j < nu) {
                uint xb = (t * nu + j) * pc.n_cols;
                float v[32];
                dequant_chunk(rb[j], c, pc.n_cols, v);
                if (len == 32u && xvec) {
                    [[unroll]] for (uint i = 0u; i < 8u; i++) {
                        vec4 xv = x4[((xb + 32u * c) >> 2) + i];
                        acc[j] += dot(vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]), xv);
                    }
                } else {
                    for (uint i = 0u; i < len; i++) {
                        acc[j] += v[i] * x[xb + 32u * c + i];
                    }
                }
            }
        }
    }
    [[unroll]] for (uint j = 0u; j < MAX_USED; j++) {
        part[j * WG + tid] = acc[j];
    }
    barrier();
    if (lane == 0u && r < pc.n_rows) {
        float tot = 0.0;
        for (uint j = 0u; j < nu; j++) {
            uint p = t * nu + j;
            float s = 0.0;
            for (uint k = 0u; k < TPR; k++) {
                s += part[j * WG + tid + k];
            }
            if ((pc.flags & 1u) != 0u) {
                s += bias[ids[p] * pc.n_rows + r];
            }
            tot += wt[p] * s;
        }
        y[t * pc.n_rows + r] += tot;
    }
}
#else
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
#endif
