#version 450
// Quantized matrix-matrix product on cooperative matrices (VK_KHR_cooperative_matrix, f16 inputs,
// f32 accumulators), the batch (prefill) path on devices that have them:
//   y[t * y_stride + y_col + r] (= | +=) dot(W row r, x[t]) (+ bias[r]),  t < n_tokens, r < n_rows.
// W: n_rows rows in their GGUF encoding (quant.glsl, type from the QTYPE_* define), row r at byte
// r * row_bytes. x: [n_tokens, n_cols] f32. Both operands are rounded to f16 in shared memory:
// the result is the product of the f16-rounded weights and inputs, summed in f32.
//
// Workgroup (x, y) = (row tile, token tile) computes C = W[BM rows] · x[BN tokens]ᵀ with 128
// invocations: 4 subgroups of 32 in a 2 x 2 grid, each owning a (BM/2) x (BN/2) block of C as
// 16 x 16 accumulators. Per step of BK columns every invocation decodes its 32-element chunk(s)
// of the W tile and loads its share of the x tile into registers; after a barrier those go to
// shared memory as f16 (`ws` [row][k]; `xs` [token][k], the B operand in column-major order), and
// while the subgroups multiply from shared memory the next step's loads are already in flight
// (register double buffering; the decoding uses quant.glsl's branch-free QWINDOW reads so that a
// chunk's loads issue together). Rows, tokens and columns past the ends are zero-filled. Results
// leave through a per-subgroup 16 x 16 staging tile so the y writes run along rows.
//
// Split-K: workgroup z = piece p covers columns [p * k_per, (p + 1) * k_per) (k_per a multiple of
// BK). With split > 1 each piece writes its raw sums to part[(p * n_tokens + t) * n_rows + r]
// and split_sum.comp adds the pieces into y (bias, accumulate); a small matrix then spreads over
// enough workgroups to fill the device instead of running its column steps one after another.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

#define QWINDOW 1 // branch-free chunk reads (quant.glsl)

#ifndef BM
#define BM 64u
#endif
#ifndef BN
#define BN 64u
#endif
#ifndef BK
#define BK 64u
#endif
#define NSG 4u
#define WGS 128u            // invocations (NSG subgroups of 32)
#define WM (BM / 2u)        // rows per subgroup
#define WN (BN / 2u)        // tokens per subgroup
#define FM (WM / 16u)       // accumulator tiles along rows
#define FN (WN / 16u)       // accumulator tiles along tokens
#define KCH (BK / 32u)      // W chunks per row per step
#define LDA (BK + 8u)       // shared row stride in halves: 16-byte aligned rows, spread banks
#define JOBS ((BM * KCH + WGS - 1u) / WGS) // W chunks per invocation per step
#define XPER (BN * BK / WGS)                // x values per invocation per step

layout(local_size_x = 128) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) writeonly buffer Part { float part[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint n_tokens;
    uint y_stride;
    uint y_col;
    uint row_bytes;
    uint flags; // bit 0: add bias, bit 1: accumulate into y
    uint k_per; // columns per split-K piece (a multiple of BK)
    uint split; // pieces (1: write y directly)
} pc;

#include "quant.glsl"

shared float16_t ws[BM * LDA]; // W tile, [row][k]
shared float16_t xs[BN * LDA]; // x tile, [token][k]
shared float cs[NSG * 256u];   // per-subgroup 16 x 16 output staging, [token][row]

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// Registers of one step: the W chunks this invocation decodes and its x values.
float vreg[JOBS][32];
float xreg[XPER];

// Decodes / loads step k0's share of the tiles into vreg / xreg (zeros past the ends).
void load_step(uint k0, uint tid, uint row0, uint tok0, uint nc) {
    for (uint q = 0u; q < JOBS; q++) {
        uint job = tid + WGS * q;
        uint r = row0 + job / KCH;
        uint c = k0 / 32u + job % KCH;
        if (job < BM * KCH && r < pc.n_rows && c < nc) {
            dequant_chunk(r * pc.row_bytes, c, pc.n_cols, vreg[q]);
        } else {
            for (uint i = 0u; i < 32u; i++) {
                vreg[q][i] = 0.0;
            }
        }
    }
    for (uint q = 0u; q < XPER; q++) {
        uint e = tid + WGS * q;
        uint t = tok0 + e / BK;
        uint col = k0 + e % BK;
        xreg[q] = (t < pc.n_tokens && col < pc.n_cols) ? x[t * pc.n_cols + col] : 0.0;
    }
}

// Writes the registers of a step to the shared tiles as f16.
void store_step(uint tid) {
    for (uint q = 0u; q < JOBS; q++) {
        uint job = tid + WGS * q;
        if (job < BM * KCH) {
            uint o = (job / KCH) * LDA + 32u * (job % KCH);
            for (uint i = 0u; i < 32u; i++) {
                ws[o + i] = float16_t(vreg[q][i]);
            }
        }
    }
    for (uint q = 0u; q < XPER; q++) {
        uint e = tid + WGS * q;
        xs[(e / BK) * LDA + e % BK] = float16_t(xreg[q]);
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.x * BM;
    uint tok0 = gl_WorkGroupID.y * BN;
    uint sg = gl_SubgroupID;
    uint wm0 = (sg % 2u) * WM;
    uint wn0 = (sg / 2u) * WN;

    ACC acc[FM][FN];
    for (uint i = 0u; i < FM; i++) {
        for (uint j = 0u; j < FN; j++) {
            acc[i][j] = ACC(0.0);
        }
    }

    uint nc = chunk_count(pc.n_cols);
    uint piece = gl_WorkGroupID.z;
    uint kb = piece * pc.k_per;
    uint ke = min(pc.n_cols, kb + pc.k_per);
    load_step(kb, tid, row0, tok0, nc);
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        store_step(tid);
        barrier();
        if (k0 + BK < ke) {
            load_step(k0 + BK, tid, row0, tok0, nc);
        }
        for (uint kk = 0u; kk < BK; kk += 16u) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[FM];
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[FN];
            for (uint i = 0u; i < FM; i++) {
                coopMatLoad(a[i], ws, (wm0 + 16u * i) * LDA + kk, LDA,
                            gl_CooperativeMatrixLayoutRowMajor);
            }
            for (uint j = 0u; j < FN; j++) {
                coopMatLoad(b[j], xs, (wn0 + 16u * j) * LDA + kk, LDA,
                            gl_CooperativeMatrixLayoutColumnMajor);
            }
            for (uint i = 0u; i < FM; i++) {
                for (uint j = 0u; j < FN; j++) {
                    acc[i][j] = coopMatMulAdd(a[i], b[j], acc[i][j]);
                }
            }
        }
        barrier();
    }

    uint lane = gl_SubgroupInvocationID;
    uint base = sg * 256u;
    bool add_bias = (pc.flags & 1u) != 0u;
    bool accumulate = (pc.flags & 2u) != 0u;
    for (uint i = 0u; i < FM; i++) {
        for (uint j = 0u; j < FN; j++) {
            // Column-major store: cs[base + 16 n + m] = C[m][n] (row m, token n).
            coopMatStore(acc[i][j], cs, base, 16u, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint e = lane; e < 256u; e += gl_SubgroupSize) {
                uint r = row0 + wm0 + 16u * i + e % 16u;
                uint t = tok0 + wn0 + 16u * j + e / 16u;
                if (r < pc.n_rows && t < pc.n_tokens && pc.split > 1u) {
                    part[(piece * pc.n_tokens + t) * pc.n_rows + r] = cs[base + e];
                } else if (r < pc.n_rows && t < pc.n_tokens) {
                    uint o = t * pc.y_stride + pc.y_col + r;
                    float s = cs[base + e];
                    if (add_bias) {
                        s += bias[r];
                    }
                    if (accumulate) {
                        s += y[o];
                    }
                    y[o] = s;
                }
            }
            subgroupBarrier();
        }
    }
}
