#version 450
// Quantized matrix-matrix product for a batch of tokens (prefill):
//   y[t * y_stride + y_col + r] (= | +=) dot(W row r, x[t]) (+ bias[r]),  t < n_tokens, r < n_rows.
// W: n_rows rows in their GGUF encoding (quant.glsl, type from the QTYPE_* define), row r at byte
// r * row_bytes. x: [n_tokens, n_cols] f32. Each workgroup computes a TM x TN tile (rows x
// tokens): per 32-element chunk it dequantizes the TM rows' chunk once into shared memory, loads
// the TN tokens' slice of x (coalesced), and every invocation accumulates a 4 x 4 block of
// outputs. Workgroup (x, y) = (row tile, token tile); partial tiles are zero-padded.
#extension GL_GOOGLE_include_directive : require

#define TM 64u
#define TN 64u
#define KS 32u
#define PAD 33u

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint n_tokens;
    uint y_stride;
    uint y_col;
    uint row_bytes;
    uint flags; // bit 0: add bias, bit 1: accumulate into y
} pc;

#include "quant.glsl"

shared float ws[TM * PAD]; // dequantized W chunk, [row][k]
shared float xs[TN * PAD]; // x slice, [token][k]

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u; // rows tx + 16i
    uint ty = tid / 16u; // tokens ty + 16j
    uint row0 = gl_WorkGroupID.x * TM;
    uint tok0 = gl_WorkGroupID.y * TN;

    float acc[4][4];
    for (uint i = 0u; i < 4u; i++) {
        for (uint j = 0u; j < 4u; j++) {
            acc[i][j] = 0.0;
        }
    }

    uint nc = chunk_count(pc.n_cols);
    for (uint c = 0u; c < nc; c++) {
        if (tid < TM) {
            uint r = row0 + tid;
            float v[32];
            if (r < pc.n_rows) {
                dequant_chunk(r * pc.row_bytes, c, pc.n_cols, v);
            } else {
                for (uint i = 0u; i < 32u; i++) {
                    v[i] = 0.0;
                }
            }
            for (uint i = 0u; i < 32u; i++) {
                ws[tid * PAD + i] = v[i];
            }
        }
        uint len = chunk_len(c, pc.n_cols);
        for (uint k = 0u; k < (TN * KS) / 256u; k++) {
            uint idx = tid + 256u * k;
            uint tok = idx / KS;
            uint i = idx % KS;
            uint t = tok0 + tok;
            xs[tok * PAD + i] = (t < pc.n_tokens && i < len) ? x[t * pc.n_cols + 32u * c + i] : 0.0;
        }
        barrier();
        for (uint k = 0u; k < KS; k++) {
            float a[4];
            float b[4];
            for (uint i = 0u; i < 4u; i++) {
                a[i] = ws[(tx + 16u * i) * PAD + k];
                b[i] = xs[(ty + 16u * i) * PAD + k];
            }
            for (uint i = 0u; i < 4u; i++) {
                for (uint j = 0u; j < 4u; j++) {
                    acc[i][j] += a[i] * b[j];
                }
            }
        }
        barrier();
    }

    for (uint i = 0u; i < 4u; i++) {
        uint r = row0 + tx + 16u * i;
        if (r >= pc.n_rows) {
            continue;
        }
        float bv = (pc.flags & 1u) != 0u ? bias[r] : 0.0;
        for (uint j = 0u; j < 4u; j++) {
            uint t = tok0 + ty + 16u * j;
            if (t < pc.n_tokens) {
                uint o = t * pc.y_stride + pc.y_col + r;
                float s = acc[i][j] + bv;
                if ((pc.flags & 2u) != 0u) {
                    s += y[o];
                }
                y[o] = s;
            }
        }
    }
}
