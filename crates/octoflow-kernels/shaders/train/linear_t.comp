#version 450
// Input gradient through a frozen quantized weight (the backward of a linear layer):
//   dx[t * n_cols + i] (= | +=) sum_o dy[t * dy_stride + dy_col + o] * W[o, i],
//   t < n_tokens, i < n_cols, o < n_rows.
// W: n_rows rows in their GGUF encoding (quant.glsl, type from the QTYPE_* define), row o at
// byte o * row_bytes. dy: [n_tokens, dy_stride] f32. dx: [n_tokens, n_cols] f32.
//
// Each workgroup owns a TI x TT tile of dx (in-columns x tokens; TI a whole number of 32-element
// chunks) and walks the out-rows KO at a time: per step it dequantizes the KO rows' TI-column
// slice of W into shared memory (one 32-element chunk per invocation of the first KO * TI / 32),
// stages the TT tokens' KO-wide slice of dy (coalesced along the rows), and every invocation
// accumulates a 4 x 4 block of outputs in registers. No atomics: each output is summed by one
// invocation in a fixed order (deterministic). Partial tiles are zero-padded.
// Workgroup (x, y) = (column tile, token tile).
#extension GL_GOOGLE_include_directive : require

#define TI 64u
#define TT 64u
#define KO 32u
#define WPAD 65u // row stride of ws (odd: the chunk writes spread over banks)
#define DPAD 33u // token stride of dys

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer DY { float dy[]; };
layout(std430, binding = 2) buffer DX { float dx[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint n_tokens;
    uint dy_stride;
    uint dy_col;
    uint row_bytes;
    uint flags; // bit 0: accumulate into dx
} pc;

#include "quant.glsl"

shared float ws[KO * WPAD]; // dequantized W slice, [out row][in column]
shared float dys[TT * DPAD]; // dy slice, [token][out row]

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u; // columns tx + 16i
    uint ty = tid / 16u; // tokens ty + 16j
    uint col0 = gl_WorkGroupID.x * TI;
    uint tok0 = gl_WorkGroupID.y * TT;
    uint chunk0 = col0 / 32u;
    uint nc = chunk_count(pc.n_cols);

    float acc[4][4]; // [token j][column i]
    for (uint j = 0u; j < 4u; j++) {
        for (uint i = 0u; i < 4u; i++) {
            acc[j][i] = 0.0;
        }
    }

    for (uint o0 = 0u; o0 < pc.n_rows; o0 += KO) {
        // W: invocation tid < KO * TI / 32 decodes chunk (chunk0 + tid % 2) of row o0 + tid / 2.
        if (tid < KO * (TI / 32u)) {
            uint rr = tid / (TI / 32u);
            uint cc = tid % (TI / 32u);
            uint o = o0 + rr;
            uint c = chunk0 + cc;
            float v[32];
            if (o < pc.n_rows && c < nc) {
                dequant_chunk(o * pc.row_bytes, c, pc.n_cols, v);
            } else {
                for (uint i = 0u; i < 32u; i++) {
                    v[i] = 0.0;
                }
            }
            for (uint i = 0u; i < 32u; i++) {
                ws[rr * WPAD + 32u * cc + i] = v[i];
            }
        }
        // dy: TT tokens x KO rows, consecutive invocations read consecutive rows of one token.
        for (uint s = 0u; s < (TT * KO) / 256u; s++) {
            uint idx = tid + 256u * s;
            uint tok = idx / KO;
            uint k = idx % KO;
            uint t = tok0 + tok;
            uint o = o0 + k;
            dys[tok * DPAD + k] =
                (t < pc.n_tokens && o < pc.n_rows) ? dy[t * pc.dy_stride + pc.dy_col + o] : 0.0;
        }
        barrier();
        for (uint k = 0u; k < KO; k++) {
            float a[4];
            float b[4];
            for (uint i = 0u; i < 4u; i++) {
                a[i] = ws[k * WPAD + tx + 16u * i];
                b[i] = dys[(ty + 16u * i) * DPAD + k];
            }
            for (uint j = 0u; j < 4u; j++) {
                for (uint i = 0u; i < 4u; i++) {
                    acc[j][i] += b[j] * a[i];
                }
            }
        }
        barrier();
    }

    for (uint j = 0u; j < 4u; j++) {
        uint t = tok0 + ty + 16u * j;
        if (t >= pc.n_tokens) {
            continue;
        }
        for (uint i = 0u; i < 4u; i++) {
            uint col = col0 + tx + 16u * i;
            if (col < pc.n_cols) {
                uint off = t * pc.n_cols + col;
                float s = acc[j][i];
                if ((pc.flags & 1u) != 0u) {
                    s += dx[off];
                }
                dx[off] = s;
            }
        }
    }
}
