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
// Q4_K: eight lanes share a super-block (256 weights, 144 bytes: a 16-byte head with d, dmin
// and the twelve 6-bit scale/min bytes, then 128 code bytes); lane (p, h) of the eight reads
// code bytes [32p + 16h, + 16) — the low nibbles are elements 64p + 16h + i of sub-block 2p,
// the high ones 64p + 32 + 16h + i of sub-block 2p + 1 — so the eight lanes read the block's
// codes as 128 contiguous bytes and four super-blocks go by per step of the row group. The min
// term (dmin * min * sum of x) of both sub-blocks is added by the h = 0 lane from the blocks'
// sums.
//
// Q5_K: the same lanes and head as Q4_K (176-byte super-blocks: head, qh[32], then the codes
// at byte 48); each code's fifth bit is bit 2p (low nibbles) or 2p + 1 (high) of qh[i] for the
// code's byte i of its 32-byte window, so a lane also reads qh's 16 bytes [16h, 16h + 16).
//
// Q6_K: a super-block is 210 bytes — ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8
// scales, the f16 d — so blocks sit at 2-byte alignment; words are read as two aligned words
// and joined. Lane (n, c) of the eight takes bytes [8c, 8c + 8) of half n's ql windows and qh:
// element 128n + 32g + 8c + i (g < 4) is code (ql[64n + 32(g % 2) + 8c + i] >> 4(g / 2)) |
// ((qh[32n + 8c + i] >> 2g) & 3) << 4, minus 32, under scale 8n + 2g + c / 2. The codes enter
// the dot unsigned (0..63) and 32 times the sum of x's codes (a dot with 0x01010101) comes off.
//
// Blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; decoded as dot.glsl says, which also holds x's
// quantization): a lane takes a whole block and 32 blocks go by per step.
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
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
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

#if defined(DOT_Q4_K) || defined(DOT_Q5_K)
#define KQUANT
#ifdef DOT_Q5_K
const uint SB_VECS = 11u; // uvec4s a super-block
const uint QS_VEC = 3u;   // where its codes start
#else
const uint SB_VECS = 9u;
const uint QS_VEC = 1u;
#endif

// lane (p, h)'s codes of the super-block at uvec4 `at` of matrix m: the low nibbles (sub-block
// 2p) in lo, the high ones (2p + 1) in hi; returns the factors of the two sub-blocks' code dots
// (d * scale) and of their x sums (dmin * min; zero on the h = 1 lane, which leaves them)
vec4 kq_decode(uint m, uint at, uint p, uint h, out uint lo[4], out uint hi[4]) {
    uvec4 hd = vec4_at(m, at);
    uvec4 qs = vec4_at(m, at + QS_VEC + 2u * p + h);
#ifdef DOT_Q5_K
    uvec4 qh = vec4_at(m, at + 1u + h);
#endif
    // scales of sub-blocks j = 2p, 2p + 1 (bytes jb = j % 4 of each scale word): for j < 4 the
    // low 6 bits of bytes j (scale) and j + 4 (min); else the nibbles of byte j + 4 with the
    // top 2 bits of bytes j - 4 and j
    uint jb = (2u * p) & 3u;
    bool low = p < 2u;
    uvec2 s0 = uvec2(byte_at(hd.y, jb), byte_at(hd.y, jb + 1u));
    uvec2 s1 = uvec2(byte_at(hd.z, jb), byte_at(hd.z, jb + 1u));
    uvec2 s2 = uvec2(byte_at(hd.w, jb), byte_at(hd.w, jb + 1u));
    uvec2 sc = low ? s0 & 63u : (s2 & 0xFu) | ((s0 >> 6) << 4);
    uvec2 mn = low ? s1 & 63u : (s2 >> 4) | ((s1 >> 6) << 4);
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        lo[i] = qs[i] & 0x0F0F0F0Fu;
        hi[i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
#ifdef DOT_Q5_K
        lo[i] |= ((qh[i] >> (2u * p)) & 0x01010101u) << 4;
        hi[i] |= ((qh[i] >> (2u * p + 1u)) & 0x01010101u) << 4;
#endif
    }
    vec2 dm = unpackHalf2x16(hd.x);
    float keep = h == 0u ? dm.y : 0.0;
    return vec4(dm.x * float(sc.x), dm.x * float(sc.y), keep * float(mn.x), keep * float(mn.y));
}
#endif

#ifdef DOT_Q6_K
// lane (n, c)'s codes of the super-block at byte `at` of matrix m: for each g < 4 two words
// cw[2g], cw[2g + 1] (unsigned, 0..63) under scale sc[g]; returns d
float q6_decode(uint m, uint at, uint n, uint c, out uint cw[8], out int sc[4]) {
    uint la = at + 64u * n + 8u * c; // ql, g = 0 and 2
    uint lb = la + 32u;               // ql, g = 1 and 3
    uint hb = at + 128u + 32u * n + 8u * c;
    uvec2 qa = uvec2(wd(m, la), wd(m, la + 4u));
    uvec2 qb = uvec2(wd(m, lb), wd(m, lb + 4u));
    uvec2 qh = uvec2(wd(m, hb), wd(m, hb + 4u));
    uvec2 sw = uvec2(wd(m, at + 192u + 8u * n), wd(m, at + 196u + 8u * n)); // scales 8n ..
    uint is = c / 2u;
    [[unroll]] for (uint g = 0u; g < 4u; g++) {
        [[unroll]] for (uint k = 0u; k < 2u; k++) {
            uint lo = g % 2u == 0u ? qa[k] : qb[k];
            cw[2u * g + k] = ((lo >> (4u * (g / 2u))) & 0x0F0F0F0Fu) |
                             (((qh[k] >> (2u * g)) & 0x03030303u) << 4);
        }
        uint si = is + 2u * g; // scale 8n + is + 2g: byte si of the two words
        sc[g] = bitfieldExtract(int(sw[si / 4u]), int(8u * (si % 4u)), 8);
    }
    return half_at(m, at + 208u);
}
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint wid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint nb = pc.n_cols / 32u;
    uint t0 = gl_WorkGroupID.z * NT;
    uint nt = min(NT, pc.n_tokens - t0);
    bool norm = pc.norm != 0u;
    uint xrow = pc.n_cols / 4u; // vec4s of one token's x

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
                uint xw = t * XW + wlo;
                int il = 0;
                int ih = 0;
                [[unroll]] for (uint i = 0u; i < 4u; i++) {
                    il += dotPacked4x8EXT(int(lo[i]), int(xq[xw + i]));
                    ih += dotPacked4x8EXT(int(hi[i]), int(xq[xw + 8u + i]));
                }
                vec2 xl = xs[t * XB + blo];
                vec2 xh = xs[t * XB + blo + 1u];
                acc[k * NT + t] += f.x * xl.x * float(il) + f.y * xh.x * float(ih) -
                                   (f.z * xl.y + f.w * xh.y);
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
                float s = 0.0;
                [[unroll]] for (uint g = 0u; g < 4u; g++) {
                    uint b = sb * 8u + 4u * n6 + g; // q8 block of x
                    uint xw = t * XW + b * 8u + 2u * c6;
                    int isum = 0;
                    int xsum = 0;
                    [[unroll]] for (uint i = 0u; i < 2u; i++) {
                        int xv = int(xq[xw + i]);
                        isum += dotPacked4x8EXT(int(cw[2u * g + i]), xv);
                        xsum += dotPacked4x8EXT(0x01010101, xv);
                    }
                    s += float(sc[g]) * xs[t * XB + b].x * float(isum - 32 * xsum);
                }
                acc[k * NT + t] += d * s;
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
                uint xw = t * XW + bi * 8u;
                int id = 0;
                [[unroll]] for (uint j = 0u; j < 8u; j++) {
                    id += dotPacked4x8EXT(int(cw[j]), int(xq[xw + j]));
                }
                acc[k * NT + t] += b32_apply(dm, id, xs[t * XB + bi]);
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
