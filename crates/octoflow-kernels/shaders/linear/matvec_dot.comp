#version 450
// One token of a Q4_K (DOT_Q4_K), Q5_K (DOT_Q5_K) or Q6_K (DOT_Q6_K) matrix-vector product on
// 8-bit integer dot products (the decode hot path of large models):
//   y[y_col + r] (= | +=) dot(W row r, q8(x)) (+ bias[r])
// where q8(x) is x (times the norm weight g when the RMSNorm is fused) quantized per block of
// 32 values as llama.cpp's q8_1: d = max|v| / 127, codes round(v / d) (half away from zero),
// and the block's sum d * sum(codes). With the norm fused the product is then scaled by
// 1 / rms(x) (the codes do not depend on it: quantization is per-block scale-free).
// The CPU reference is `matvec_dot_ref` (linear/matvec_dot.rs), which quantizes the same way.
//
// Why: dequantizing every weight to f32 costs four or five instructions a weight, which on
// an 8B model's matrices takes longer than reading the weights (docs/perf-log); with x in 8
// bits, eight nibbles meet eight codes of x in two instructions (mask or shift-and-mask, then
// a 4x8-bit dot product), and the scales enter once per 16 weights.
//
// Layout: every workgroup first quantizes the whole x into shared memory (one block of 32 per
// invocation at a time, the sum of squares for the norm on the way), then its GROUPS row
// groups of 32 lanes each take RPT rows at once. Eight lanes share a super-block (256 weights,
// 144 bytes: a 16-byte head with d, dmin and the twelve 6-bit scale/min bytes, then 128 code
// bytes); lane (p, h) of the eight reads code bytes [32p + 16h, + 16) — the low nibbles are
// elements 64p + 16h + i of sub-block 2p, the high ones 64p + 32 + 16h + i of sub-block
// 2p + 1 — so the eight lanes read the block's codes as 128 contiguous bytes and four
// super-blocks go by per step of the row group. The min term (dmin * min * sum of x) of both
// sub-blocks is added by the h = 0 lane from the blocks' sums.
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
// GLU (matvec_dot_glu_q4_k, _q5_k): gate (binding 0) and up (binding 5) rows of the same shape, both
// of the same q8(x); y[y_col + r] = act(gate) * up (glu.glsl), bias and accumulate ignored.
//
// The host checks: one token, n_cols a multiple of 256 and at most MAX_COLS, the weights'
// binding offsets 16-byte aligned (Q4_K and Q5_K rows are whole super-blocks of 144 = 9 * 16
// and 176 = 11 * 16 bytes; Q6_K's are read a word at a time), the subgroup size dividing 32.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_integer_dot_product : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256u;
layout(constant_id = 1) const uint RPT = 2u; // rows a row group takes at once
const uint TPR = 32u;                        // lanes of a row group
const uint GROUPS = WG / TPR;
const uint MAX_COLS = 16384u;
const uint MAX_BLOCKS = MAX_COLS / 32u;
#ifdef GLU
const uint NM = 2u; // matrices
#else
const uint NM = 1u;
#endif

#include "common.glsl"

layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
layout(std430, binding = 0) readonly buffer W1 { uint w1[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) readonly buffer G4 { vec4 g4[]; };
#ifdef GLU
layout(std430, binding = 5) readonly buffer U4 { uvec4 u4[]; };
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

shared uint xq[MAX_COLS / 4u]; // the codes of q8(x), four to a word, lowest byte first
shared vec2 xs[MAX_BLOCKS];    // per block: (d, d * sum of its codes)
shared float part[WG * NM * RPT]; // subgroup partial sums (the sum of squares, then the rows')

// half away from zero, as llama.cpp's roundf (the reference computes it the same way)
float round_away(float v) {
    return sign(v) * floor(abs(v) + 0.5);
}

uint byte_at(uint u, uint k) {
    return (u >> (8u * k)) & 0xFFu;
}

#if defined(DOT_Q4_K) || defined(DOT_Q5_K)
#ifdef DOT_Q5_K
const uint SB_VECS = 11u; // uvec4s a super-block
const uint QS_VEC = 3u;   // where its codes start
#else
const uint SB_VECS = 9u;
const uint QS_VEC = 1u;
#endif

// the contribution of one lane's 32 weights of super-block sb (head hd, codes qs, and for
// Q5_K the high bits qh) of a row
float lane_dot(uvec4 hd, uvec4 qs, uvec4 qh, uint sb, uint p, uint h) {
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
    vec2 dm = unpackHalf2x16(hd.x);
    uint blo = sb * 8u + 2u * p; // q8 blocks of the two sub-blocks
    uint wlo = blo * 8u + 4u * h;
    uint whi = wlo + 8u;
    int il = 0;
    int ih = 0;
    [[unroll]] for (uint m = 0u; m < 4u; m++) {
        uint lo = qs[m] & 0x0F0F0F0Fu;
        uint hi = (qs[m] >> 4) & 0x0F0F0F0Fu;
#ifdef DOT_Q5_K
        lo |= ((qh[m] >> (2u * p)) & 0x01010101u) << 4;
        hi |= ((qh[m] >> (2u * p + 1u)) & 0x01010101u) << 4;
#endif
        il += dotPacked4x8EXT(int(lo), int(xq[wlo + m]));
        ih += dotPacked4x8EXT(int(hi), int(xq[whi + m]));
    }
    vec2 xl = xs[blo];
    vec2 xh = xs[blo + 1u];
    float r = dm.x * (float(sc.x) * xl.x * float(il) + float(sc.y) * xh.x * float(ih));
    if (h == 0u) {
        r -= dm.y * (float(mn.x) * xl.y + float(mn.y) * xh.y);
    }
    return r;
}
#endif

#ifdef DOT_Q6_K
// the word at byte b of the weights (b even: a block's bytes lie at 2-byte alignment)
uint wd(uint b) {
    uint i = b >> 2;
    return (b & 2u) == 0u ? w1[i] : (w1[i] >> 16) | (w1[i + 1u] << 16);
}

// the contribution of lane (n, c)'s 32 weights of the super-block at byte `at` (its index sb)
float q6_dot(uint at, uint sb, uint n, uint c) {
    uint la = at + 64u * n + 8u * c; // ql, g = 0 and 2
    uint lb = la + 32u;               // ql, g = 1 and 3
    uint hb = at + 128u + 32u * n + 8u * c;
    uvec2 qa = uvec2(wd(la), wd(la + 4u));
    uvec2 qb = uvec2(wd(lb), wd(lb + 4u));
    uvec2 qh = uvec2(wd(hb), wd(hb + 4u));
    uvec2 sw = uvec2(wd(at + 192u + 8u * n), wd(at + 196u + 8u * n)); // scales 8n .. 8n + 8
    uint dw = w1[(at + 208u) >> 2]; // d: a whole word of this block either way
    float d = ((at + 208u) & 2u) == 0u ? unpackHalf2x16(dw).x : unpackHalf2x16(dw).y;
    uint is = c / 2u;
    float r = 0.0;
    [[unroll]] for (uint g = 0u; g < 4u; g++) {
        uint b = sb * 8u + 4u * n + g;   // q8 block of x
        uint xw = b * 8u + 2u * c;       // its words of this lane's 8 values
        int isum = 0;
        int xsum = 0;
        [[unroll]] for (uint k = 0u; k < 2u; k++) {
            uint lo = g % 2u == 0u ? qa[k] : qb[k];
            uint code = ((lo >> (4u * (g / 2u))) & 0x0F0F0F0Fu) |
                        (((qh[k] >> (2u * g)) & 0x03030303u) << 4);
            int xv = int(xq[xw + k]);
            isum += dotPacked4x8EXT(int(code), xv);
            xsum += dotPacked4x8EXT(0x01010101, xv);
        }
        uint si = is + 2u * g; // scale 8n + is + 2g: byte si of the two words
        int sc = bitfieldExtract(int(sw[si / 4u]), int(8u * (si % 4u)), 8);
        r += float(sc) * xs[b].x * float(isum - 32 * xsum);
    }
    return d * r;
}
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint wid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint nb = pc.n_cols / 32u;
    bool norm = pc.norm != 0u;

    // 1. q8(x) (times g) into shared memory, the sum of squares of x on the way
    float ss = 0.0;
    for (uint b = tid; b < nb; b += WG) {
        vec4 v[8];
        float amax = 0.0;
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            vec4 xv = x4[b * 8u + i];
            ss += dot(xv, xv);
            if (norm) {
                xv *= g4[b * 8u + i];
            }
            v[i] = xv;
            vec4 a = abs(xv);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        float d = amax / 127.0;
        float id = d > 0.0 ? 1.0 / d : 0.0;
        int sum = 0;
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
            ivec4 q = ivec4(round_away(v[i].x * id), round_away(v[i].y * id),
                            round_away(v[i].z * id), round_away(v[i].w * id));
            sum += q.x + q.y + q.z + q.w;
            xq[b * 8u + i] = uint(q.x & 0xFF) | (uint(q.y & 0xFF) << 8) |
                             (uint(q.z & 0xFF) << 16) | (uint(q.w & 0xFF) << 24);
        }
        xs[b] = vec2(d, d * float(sum));
    }
    float inv = 1.0;
    if (norm) {
        ss = subgroupAdd(ss);
        if (subgroupElect()) {
            part[gl_SubgroupID] = ss;
        }
        barrier();
        float tot = 0.0;
        for (uint s = 0u; s < gl_NumSubgroups; s++) {
            tot += part[s];
        }
        inv = 1.0 / sqrt(tot / float(pc.n_cols) + pc.eps);
    }
    barrier(); // the codes, and every read of part above, before the rows reuse part

    // 2. the rows
    uint rg = tid / TPR;
    uint lane = tid % TPR;
    uint p = (lane % 8u) / 2u;
    uint h = lane % 2u;
    uint r0 = (wid * GROUPS + rg) * RPT;
    uint n_sb = pc.n_cols / 256u;
    uint rw = pc.row_bytes / 16u; // uvec4s a row
    float acc[NM * RPT];
    [[unroll]] for (uint k = 0u; k < NM * RPT; k++) {
        acc[k] = 0.0;
    }
#if defined(DOT_Q4_K) || defined(DOT_Q5_K)
    for (uint sb = lane / 8u; sb < n_sb; sb += 4u) {
        uvec4 hd[NM * RPT];
        uvec4 qs[NM * RPT];
        uvec4 qh[NM * RPT];
        [[unroll]] for (uint k = 0u; k < RPT; k++) {
            uint r = min(r0 + k, pc.n_rows - 1u); // rows past the end read the last (not written)
            uint at = r * rw + sb * SB_VECS;
            hd[k] = w4[at];
            qs[k] = w4[at + QS_VEC + 2u * p + h];
#ifdef DOT_Q5_K
            qh[k] = w4[at + 1u + h];
#else
            qh[k] = uvec4(0u);
#endif
#ifdef GLU
            hd[RPT + k] = u4[at];
            qs[RPT + k] = u4[at + QS_VEC + 2u * p + h];
#ifdef DOT_Q5_K
            qh[RPT + k] = u4[at + 1u + h];
#else
            qh[RPT + k] = uvec4(0u);
#endif
#endif
        }
        [[unroll]] for (uint k = 0u; k < NM * RPT; k++) {
            acc[k] += lane_dot(hd[k], qs[k], qh[k], sb, p, h);
        }
    }
#else
    // lane (n, c) of the eight: n = half of the super-block, c = which 8 bytes of its windows
    uint n6 = (lane % 8u) / 4u;
    uint c6 = lane % 4u;
    for (uint sb = lane / 8u; sb < n_sb; sb += 4u) {
        [[unroll]] for (uint k = 0u; k < RPT; k++) {
            uint r = min(r0 + k, pc.n_rows - 1u);
            acc[k] += q6_dot(r * pc.row_bytes + sb * 210u, sb, n6, c6);
        }
    }
#endif
    // a row's sum over its 32 lanes: subgroups, then the subgroups of a row group
    uint per = TPR / gl_SubgroupSize; // subgroups a row group (the host keeps it whole)
    [[unroll]] for (uint k = 0u; k < NM * RPT; k++) {
        float s = subgroupAdd(acc[k]);
        if (subgroupElect()) {
            part[gl_SubgroupID * NM * RPT + k] = s;
        }
    }
    barrier();
    if (lane < RPT) {
        uint r = r0 + lane;
        if (r < pc.n_rows) {
            float v[NM];
            [[unroll]] for (uint m = 0u; m < NM; m++) {
                float s = 0.0;
                for (uint i = 0u; i < per; i++) {
                    s += part[(rg * per + i) * NM * RPT + m * RPT + lane];
                }
                v[m] = s * inv;
            }
            uint yi = pc.y_col + r;
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
