#version 450
// Up to NT tokens of a matrix product on 8-bit integer dot products (the decode hot path of
// large models, and batches of a few tokens):
//   y[t * y_stride + y_col + r] (= | +=) dot(W row r, q8(x_t)) (+ bias[r])
// where q8(x_t) is token t's x (times the norm weight g when the RMSNorm is fused) quantized
// per block of 32 values as llama.cpp's q8_1: d = max|v| / 127, codes round(v / d) (half away
// from zero), and the block's sum d * sum(codes). With the norm fused the product is then
// scaled by 1 / rms(x_t) (the codes do not depend on it: quantization is per-block scale-free).
// The CPU reference is `matvec_dot_ref` (linear/matvec_dot.rs), which quantizes the same way.
//
// Why: dequantizing every weight to f32 costs four or five instructions a weight, which on
// an 8B model's matrices takes longer than reading the weights (docs/perf-log); with x in 8
// bits, four codes of a weight row meet four of x in one instruction, and the scales enter
// once per 16 or 32 weights. A weight is decoded once for all of a workgroup's tokens, and x is
// quantized once per workgroup into shared memory, not read again per row: that is what makes
// a few tokens cost little more than one.
//
// Layout: workgroup (x, y) takes GROUPS * RPT rows, its z index tokens [z NT, z NT + NT). It
// first quantizes its tokens' x into shared memory (one block of 32 per invocation at a time,
// each block's sum of squares on the way for the norm), then its GROUPS row groups of 32 lanes
// each take RPT rows at once.
//
// The blocks are decoded as dot.glsl says (which also holds x's quantization): for the K-quants
// eight lanes share a super-block and four super-blocks go by per step of a row group; for the
// blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) a lane takes a whole block and 32 blocks go by.
//
// XQ variants: x was quantized once for the whole product by quantize_q8.comp (its codes,
// scales and 1 / rms per token in one buffer at binding 1); each workgroup copies its tokens'
// share into shared memory instead of quantizing it (`Tuning::quantize_once`).
//
// Benchmark variant (`@bench` in variants.txt, benches/dot_bench.rs): ABL_NOQ neither reads
// nor quantizes x (wrong results: the cost of the product alone).
//
// GLU (the _glu variants): gate (binding 0) and up (binding 5) rows of the same shape, both of
// the same q8(x); y = act(gate) * up (glu.glsl), bias and accumulate ignored.
//
// The host checks: n_cols a multiple of 256 (K-quants) or 32 (blocks of 32) and at most MAXC,
// shared memory for NT tokens of MAXC columns, K-quant weights at 16-byte aligned offsets and
// the others at 4-byte ones with a whole number of words, the subgroup size dividing 32.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_integer_dot_product : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256u;
layout(constant_id = 1) const uint RPT = 2u;    // rows a row group takes at once
layout(constant_id = 2) const uint NT = 1u;     // tokens a workgroup takes
layout(constant_id = 3) const uint MAXC = 256u; // widest row the shared x holds (32-multiple)
layout(constant_id = 4) const uint SG = 4u;     // narrowest subgroup it runs with (part's size)
const uint TPR = 32u;                           // lanes of a row group
const uint GROUPS = WG / TPR;
const uint XW = MAXC / 4u;                      // words of one token's codes
const uint XB = MAXC / 32u;                     // blocks of one token
#ifdef GLU
const uint NM = 2u; // matrices
#else
const uint NM = 1u;
#endif
const uint NACC = NM * RPT * NT; // accumulators of a lane: (matrix, row, token)

#include "common.glsl"

layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly buffer W1 { uint w1[]; };
#ifdef XQ
// x already quantized by quantize_q8.comp (its layout there)
layout(std430, binding = 1) readonly buffer XG { uint xg[]; };
layout(std430, binding = 1) readonly buffer XGF { float xgf[]; };
#else
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
#endif
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) readonly buffer G4 { vec4 g4[]; };
#ifdef GLU
layout(std430, binding = 5) readonly buffer U4 { uvec4 u4[]; };
layout(std430, binding = 5) readonly buffer U1 { uint u1[]; };
#endif

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint n_tokens;
    uint y_stride;
    uint y_col;
    uint row_bytes;
    uint flags; // bit 0: add bias, bit 1: accumulate into y
    float eps;
    uint norm;  // 1: the input is rms_norm(x) * g
#ifdef GLU
    uint act;   // glu.glsl's op
#endif
} pc;

#ifdef GLU
#include "glu.glsl"
#endif

shared uint xq[NT * XW];   // the codes of q8(x_t), four to a word, lowest byte first
shared vec2 xs[NT * XB];   // per block: (d, d * sum of its codes)
shared float xn[NT * XB];  // per block: the sum of squares of x (the norm)
shared float invs[NT];     // per token: 1 / rms(x_t), or 1
shared float part[(WG / SG) * NACC]; // subgroups' partial sums of the rows

// word i of matrix m (0: the weights, 1: GLU's up)
uint word(uint m, uint i) {
#ifdef GLU
    return m == 0u ? w1[i] : u1[i];
#else
    return w1[i];
#endif
}

uvec4 vec4_at(uint m, uint i) {
#ifdef GLU
    return m == 0u ? w4[i] : u4[i];
#else
    return w4[i];
#endif
}

#include "dot.glsl"

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint wid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint nb = pc.n_cols / 32u;
    uint t0 = gl_WorkGroupID.z * NT;
    uint nt = min(NT, pc.n_tokens - t0);
    bool norm = pc.norm != 0u;
    uint xrow = pc.n_cols / 4u; // vec4s of one token's x

#ifdef XQ
    // 1. q8(x_t) and 1 / rms(x_t) as quantize_q8.comp wrote them (MAXC = n_cols: XW and XB are
    // its row strides); the tokens past the batch's end as zeros
    uint sbase = pc.n_tokens * XW;
    uint ibase = sbase + 2u * pc.n_tokens * XB;
    for (uint i = tid; i < NT * XW; i += WG) {
        uint t = i / XW;
        xq[i] = t < nt ? xg[t0 * XW + i] : 0u;
    }
    for (uint i = tid; i < NT * XB; i += WG) {
        uint t = i / XB;
        uint si = sbase + 2u * (t0 * XB + i);
        xs[i] = t < nt ? vec2(xgf[si], xgf[si + 1u]) : vec2(0.0);
    }
    for (uint t = tid; t < NT; t += WG) {
        invs[t] = t < nt ? xgf[ibase + t0 + t] : 1.0;
    }
    barrier();
#else
    // 1. q8(x_t) (times g) into shared memory, each block's sum of squares on the way; the
    // tokens past the batch's end as zeros
    for (uint i = tid; i < NT * nb; i += WG) {
        uint t = i / nb;
        uint b = i - t * nb;
        uint o = t * XW + b * 8u;
#ifdef ABL_NOQ
        // (benchmark ablation, wrong results) x neither read nor quantized: what the product
        // costs with its input's codes already at hand
        t = nt;
#endif
        if (t >= nt) {
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                xq[o + j] = 0u;
            }
            xs[t * XB + b] = vec2(0.0);
            xn[t * XB + b] = 0.0;
            continue;
        }
        uint xi = (t0 + t) * xrow + b * 8u;
        vec4 v[8];
        float ss = 0.0;
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            vec4 xv = x4[xi + j];
            ss += dot(xv, xv);
            if (norm) {
                xv *= g4[b * 8u + j];
            }
            v[j] = xv;
        }
        xs[t * XB + b] = q8_store(v, o);
        xn[t * XB + b] = ss;
    }
    barrier();
    // 1 / rms(x_t) per token, a subgroup a token (1 without the norm)
    for (uint t = gl_SubgroupID; t < NT; t += gl_NumSubgroups) {
        float s = 0.0;
        for (uint b = gl_SubgroupInvocationID; b < nb; b += gl_SubgroupSize) {
            s += xn[t * XB + b];
        }
        s = subgroupAdd(s);
        if (subgroupElect()) {
            invs[t] = norm ? 1.0 / sqrt(s / float(pc.n_cols) + pc.eps) : 1.0;
        }
    }
    barrier();
#endif

    // 2. the rows: accumulator (k, t) of matrix k / RPT, row r0 + k % RPT, token t
    uint rg = tid / TPR;
    uint lane = tid % TPR;
    uint r0 = (wid * GROUPS + rg) * RPT;
    float acc[NACC];
    [[unroll]] for (uint k = 0u; k < NACC; k++) {
        acc[k] = 0.0;
    }
#ifdef KQUANT
    uint p = (lane % 8u) / 2u;
    uint h = lane % 2u;
    uint n_sb = pc.n_cols / 256u;
    uint rw = pc.row_bytes / 16u; // uvec4s a row
    for (uint sb = lane / 8u; sb < n_sb; sb += 4u) {
        uint blo = sb * 8u + 2u * p; // q8 blocks of the two sub-blocks
        uint wlo = blo * 8u + 4u * h;
        [[unroll]] for (uint k = 0u; k < NM * RPT; k++) {
            uint r = min(r0 + k % RPT, pc.n_rows - 1u); // rows past the end read the last
            uint lo[4];
            uint hi[4];
            vec4 f = kq_decode(k / RPT, r * rw + sb * SB_VECS, p, h, lo, hi);
            [[unroll]] for (uint t = 0u; t < NT; t++) {
                acc[k * NT + t] += kq_dot(f, lo, hi, t * XW + wlo, t * XB + blo);
            }
        }
    }
#endif
#ifdef DOT_Q6_K
    // lane (n, c) of the eight: n = half of the super-block, c = which 8 bytes of its windows
    uint n6 = (lane % 8u) / 4u;
    uint c6 = lane % 4u;
    uint n_sb = pc.n_cols / 256u;
    for (uint sb = lane / 8u; sb < n_sb; sb += 4u) {
        [[unroll]] for (uint k = 0u; k < NM * RPT; k++) {
            uint r = min(r0 + k % RPT, pc.n_rows - 1u);
            uint cw[8];
            int sc[4];
            float d = q6_decode(k / RPT, r * pc.row_bytes + sb * 210u, n6, c6, cw, sc);
            [[unroll]] for (uint t = 0u; t < NT; t++) {
                acc[k * NT + t] += d * q6_dot(cw, sc, t * XW, t * XB, sb * 8u + 4u * n6, c6);
            }
        }
    }
#endif
#ifdef BLOCK32
    for (uint bi = lane; bi < nb; bi += TPR) {
        [[unroll]] for (uint k = 0u; k < NM * RPT; k++) {
            uint r = min(r0 + k % RPT, pc.n_rows - 1u);
            uint cw[8];
            vec2 dm = b32_decode(k / RPT, r * pc.row_bytes + bi * BB, cw);
            [[unroll]] for (uint t = 0u; t < NT; t++) {
                acc[k * NT + t] += b32_dot(dm, cw, t * XW + bi * 8u, t * XB + bi);
            }
        }
    }
#endif
    // a row's sum over its 32 lanes: subgroups, then the subgroups of a row group
    uint per = TPR / gl_SubgroupSize; // subgroups a row group (the host keeps it whole)
    [[unroll]] for (uint k = 0u; k < NACC; k++) {
        float s = subgroupAdd(acc[k]);
        if (subgroupElect()) {
            part[gl_SubgroupID * NACC + k] = s;
        }
    }
    barrier();
    for (uint j = lane; j < RPT * NT; j += TPR) {
        uint kr = j % RPT;
        uint t = j / RPT;
        uint r = r0 + kr;
        if (r < pc.n_rows && t < nt) {
            float v[NM];
            [[unroll]] for (uint m = 0u; m < NM; m++) {
                float s = 0.0;
                for (uint i = 0u; i < per; i++) {
                    s += part[(rg * per + i) * NACC + (m * RPT + kr) * NT + t];
                }
                v[m] = s * invs[t];
            }
            uint yi = (t0 + t) * pc.y_stride + pc.y_col + r;
#ifdef GLU
            y[yi] = glu_act(v[0], pc.act) * v[1];
#else
            float o = v[0];
            if ((pc.flags & 1u) != 0u) {
                o += bias[r];
            }
            if ((pc.flags & 2u) != 0u) {
                o += y[yi];
            }
            y[yi] = o;
#endif
        }
    }
}
