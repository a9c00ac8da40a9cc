#version 450
// Grouped expert products of a batch (prefill, batched serving): for each expert e of
// [e_begin, e_begin + e_count) and each pair p of its group (moe_group.comp: list[offsets[e] ..
// offsets[e + 1]), increasing), the product with expert e's rows:
//   y[p * n_rows + r] = dot(W_e row r, x[p / x_div]) (+ bias[e * n_rows + r]),
// every weight of an expert read once per tile of its pairs, not once per pair. W, x_div, the
// biases and the GLU variants (gate, up and moe_act in one dispatch) as moe_matvec.comp.
// Workgroup (x, y, z) = (TM-row tile, TN-pair tile of the group, expert e_begin + z); tiles past
// the group's end leave at once (the grid is sized for the largest possible group: every token
// of the batch). Each tile gathers its pairs' inputs and scatters its outputs through the list:
// per 32-element chunk, the TM rows' chunk is dequantized once into shared memory, the TN pairs'
// slice of x loaded beside it, and every invocation accumulates a 4 x 4 block.
#extension GL_GOOGLE_include_directive : require

#define TM 64u
#define TN 64u
#define KS 32u
#define PAD 33u
#define NONE 0xffffffffu

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) readonly buffer Off { uint offsets[]; };
layout(std430, binding = 5) readonly buffer List { uint list[]; };
#ifdef GLU
layout(std430, binding = 6) readonly buffer W2 { uint w2[]; };
layout(std430, binding = 7) readonly buffer Bias2 { float bias2[]; };
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
#endif

shared float ws[TM * PAD]; // dequantized W chunk, [row][k]
#ifdef GLU
shared float ws2[TM * PAD];
#endif
shared float xs[TN * PAD]; // the pairs' x slice, [pair][k]
shared uint ent[TN];       // the tile's pairs (NONE past the group's end)

// Row row0 + tid's chunk c (of both matrices for GLU) into the shared tile(s), zeros past n_rows.
void load_w(uint tid, uint row0, uint base, uint c) {
    uint r = row0 + tid;
    float v[32];
#ifdef GLU
    float v2[32];
#endif
    if (r < pc.n_rows) {
        dequant_chunk(base + r * pc.row_bytes, c, pc.n_cols, v);
#ifdef GLU
        dequant_chunk_2(base + r * pc.row_bytes, c, pc.n_cols, v2);
#endif
    } else {
        for (uint i = 0u; i < 32u; i++) {
            v[i] = 0.0;
#ifdef GLU
            v2[i] = 0.0;
#endif
        }
    }
    for (uint i = 0u; i < 32u; i++) {
        ws[tid * PAD + i] = v[i];
#ifdef GLU
        ws2[tid * PAD + i] = v2[i];
#endif
    }
}

void main() {
    uint e = pc.e_begin + gl_WorkGroupID.z;
    uint first = offsets[e];
    uint count = offsets[e + 1u] - first;
    uint tok0 = gl_WorkGroupID.y * TN;
    if (tok0 >= count) {
        return; // the whole workgroup: past this expert's group
    }
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u; // rows tx + 16i
    uint ty = tid / 16u; // pairs ty + 16j
    uint row0 = gl_WorkGroupID.x * TM;
    uint base = gl_WorkGroupID.z * pc.n_rows * pc.row_bytes;
    if (tid < TN) {
        ent[tid] = tok0 + tid < count ? list[first + tok0 + tid] : NONE;
    }
    barrier();

    float acc[4][4];
#ifdef GLU
    float acc2[4][4];
#endif
    for (uint i = 0u; i < 4u; i++) {
        for (uint j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
#ifdef GLU
            acc2[i][j] = 0.0;
#endif
        }
    }

    uint nc = chunk_count(pc.n_cols);
    for (uint c = 0u; c < nc; c++) {
        if (tid < TM) {
            load_w(tid, row0, base, c);
        }
        uint len = chunk_len(c, pc.n_cols);
        for (uint k = 0u; k < (TN * KS) / 256u; k++) {
            uint idx = tid + 256u * k;
            uint tok = idx / KS;
            uint i = idx % KS;
            uint p = ent[tok];
            xs[tok * PAD + i] = (p != NONE && i < len) ? x[(p / pc.x_div) * pc.n_cols + 32u * c + i] : 0.0;
        }
        barrier();
        for (uint k = 0u; k < KS; k++) {
            float a[4];
            float b[4];
#ifdef GLU
            float a2[4];
#endif
            for (uint i = 0u; i < 4u; i++) {
                a[i] = ws[(tx + 16u * i) * PAD + k];
#ifdef GLU
                a2[i] = ws2[(tx + 16u * i) * PAD + k];
#endif
                b[i] = xs[(ty + 16u * i) * PAD + k];
            }
            for (uint i = 0u; i < 4u; i++) {
                for (uint j = 0u; j < 4u; j++) {
                    acc[i][j] += a[i] * b[j];
#ifdef GLU
                    acc2[i][j] += a2[i] * b[j];
#endif
                }
            }
        }
        barrier();
    }

    bool add_bias = (pc.flags & 1u) != 0u;
    for (uint i = 0u; i < 4u; i++) {
        uint r = row0 + tx + 16u * i;
        if (r >= pc.n_rows) {
            continue;
        }
        float bv = add_bias ? bias[e * pc.n_rows + r] : 0.0;
#ifdef GLU
        float bv2 = add_bias ? bias2[e * pc.n_rows + r] : 0.0;
#endif
        for (uint j = 0u; j < 4u; j++) {
            uint p = ent[ty + 16u * j];
            if (p == NONE) {
                continue;
            }
#ifdef GLU
            y[p * pc.n_rows + r] = moe_act(acc[i][j] + bv, acc2[i][j] + bv2, pc.act, pc.alpha, pc.limit);
#else
            y[p * pc.n_rows + r] = acc[i][j] + bv;
#endif
        }
    }
}
