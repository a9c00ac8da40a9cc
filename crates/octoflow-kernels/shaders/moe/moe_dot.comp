#version 450
// Expert products of a few tokens (decode) on 8-bit integer dot products: moe_matvec.comp's
// work (each (token, slot) pair p < n_pairs takes the rows of its expert ids[p] and no other)
// with matvec_dot.comp's arithmetic (dot.glsl) for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4
// (gpt-oss's experts) and the K-quants Q4_K, Q5_K, Q6_K (qwen3moe's):
//   y[p * n_rows + r] = dot(W_e row r, q8(x[p / x_div])) (+ bias[e * n_rows + r]),  e = ids[p]
// q8(x) as matvec_dot.comp quantizes it (per block of 32 as llama.cpp's q8_1). The CPU
// reference is `moe_experts_dot_ref` (moe/experts_dot.rs).
//
// Why: decoding every weight to f32 and reading 128 bytes of f32 x per 17-byte MXFP4 block
// made the f32 kernel several times slower than reading the experts (docs/PERFORMANCE.md);
// here x is quantized once per workgroup into shared memory and four codes meet four of x in
// one instruction.
//
// Variants: plain; GLU (gate at binding 0, up at 5, their biases at 3 and 6, y =
// moe_act(gate, up)); COMBINE (the down products of a token's n_used pairs added into the
// residual stream at once, as moe_combine.comp adds them:
//   y[t * n_rows + r] += sum_j wt[p] * (dot(W_e row r, q8(x[p])) (+ bias)),  p = t n_used + j,
// j in increasing order; the whole tensor bound as one piece).
//
// GROUPED (with or without GLU): a batch's pairs grouped by expert (moe_group.comp's offsets and
// list, as the cooperative-matrix MOE variants read them); workgroup z is expert e_begin + z, y
// the y-th run of NU pairs of its group (runs past the group's end leave at once: the grid is
// sized for the largest possible group), so each weight is read and decoded once for up to NU
// pairs of its expert instead of once per pair. Their x was quantized once for the product
// (quantize_q8.comp's layout at binding 1, a row per input row: n_pairs / x_div of them): each
// workgroup copies its pairs' rows instead of quantizing them.
//
// XQ (GLU, one pair a workgroup): x already quantized for the product in quantize_q8.comp's
// layout — by the fused router (moe_router.comp), which computes the experts' input anyway —
// copied as GROUPED copies it.
//
// Benchmark variants (`@bench` in variants.txt, benches/moe_bench.rs): ABL_NOQ neither reads
// nor quantizes x (wrong results: the cost of the products alone).
//
// Layout: workgroup x takes GROUPS * RPT rows in GROUPS row groups of 32 lanes, y its pair
// (COMBINE: its token, all NU = n_used of its pairs; GROUPED: up to NU pairs of one expert);
// it first quantizes its pairs' inputs into
// shared memory, then each lane takes its share of its row group's RPT rows (a whole block of
// 32, or an eighth of a K-quant super-block), decoded once and dotted with each pair's codes of
// x. A tensor larger than one
// binding is bound in pieces of whole experts [e_begin, e_begin + e_count), one dispatch each;
// a pair whose expert lies in another piece is left to that piece's dispatch.
//
// The host checks: n_cols a multiple of 32 (64 for the 2-byte aligned Q4_0, Q5_0, Q8_0: whole
// words a row; 256 for the K-quants) and at most MAXC, x's rows at 16-byte aligned offsets (and
// Q4_K/Q5_K weights), shared memory for NU rows of MAXC codes, the subgroup size dividing 32.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_integer_dot_product : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 256u;
layout(constant_id = 1) const uint RPT = 2u;    // rows a row group takes at once
layout(constant_id = 2) const uint NU = 1u;     // pairs a workgroup takes (COMBINE: n_used)
layout(constant_id = 3) const uint MAXC = 256u; // widest row the shared x holds (32-multiple)
layout(constant_id = 4) const uint SG = 4u;     // narrowest subgroup it runs with (part's size)
const uint TPR = 32u;                           // lanes of a row group
const uint GROUPS = WG / TPR;
const uint XW = MAXC / 4u;                      // words of one pair's codes
const uint XB = MAXC / 32u;                     // blocks of one pair
#ifdef GLU
const uint NM = 2u; // matrices
#else
const uint NM = 1u;
#endif
const uint NACC = NM * RPT * NU; // accumulators of a lane: (matrix, row, pair)
#ifdef GROUPED
const bool ONE_EXPERT = true;   // every pair of the workgroup reads the same rows: decoded once
#else
const bool ONE_EXPERT = false;
#endif

#include "common.glsl"

layout(std430, binding = 0) readonly buffer W1 { uint w1[]; };
layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
#if defined(GROUPED) || defined(XQ)
layout(std430, binding = 1) readonly buffer XG { uint xg[]; };
layout(std430, binding = 1) readonly buffer XGF { float xgf[]; };
#else
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
#endif
#ifdef COMBINE
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 5) readonly buffer Wt { float wt[]; };
#else
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
#endif
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) readonly buffer Ids { uint ids[]; };
#ifdef GLU
layout(std430, binding = 5) readonly buffer U1 { uint u1[]; };
layout(std430, binding = 5) readonly buffer U4 { uvec4 u4[]; };
layout(std430, binding = 6) readonly buffer BiasU { float bias_u[]; };
#endif
#ifdef GROUPED
#ifdef GLU
layout(std430, binding = 7) readonly buffer Off { uint offsets[]; };
layout(std430, binding = 8) readonly buffer List { uint list[]; };
#else
layout(std430, binding = 5) readonly buffer Off { uint offsets[]; };
layout(std430, binding = 6) readonly buffer List { uint list[]; };
#endif
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
    uint n_used; // COMBINE: pairs per token (= NU)
} pc;

shared uint xq[NU * XW];  // the codes of q8(x) of each pair, four to a word
shared vec2 xs[NU * XB];  // per block: (d, d * sum of its codes)
shared float part[(WG / SG) * NACC]; // subgroups' partial sums of the rows

uint p0;      // the first pair (GROUPED: the first of this workgroup's run in the list)
uint nv = NU; // pairs of this workgroup (GROUPED: fewer at the end of a group)

// pair j < nv of this workgroup
uint pair_of(uint j) {
#ifdef GROUPED
    return list[p0 + j];
#else
    return p0 + j;
#endif
}

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
#ifdef GLU
#include "moe_act.glsl"
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint nb = pc.n_cols / 32u;
    uint xrow = pc.n_cols / 4u; // vec4s of one row of x
#if defined(GROUPED)
    uint e = pc.e_begin + gl_WorkGroupID.z;
    p0 = offsets[e] + gl_WorkGroupID.y * NU;
    uint g1 = offsets[e + 1u];
    if (p0 >= g1) {
        return; // the whole workgroup: past its group's end
    }
    nv = min(NU, g1 - p0);
#elif defined(COMBINE)
    p0 = gl_WorkGroupID.y * NU; // the token's first pair
#else
    p0 = gl_WorkGroupID.y;
    uint e = ids[p0];
    if (e < pc.e_begin || e - pc.e_begin >= pc.e_count) {
        return; // the whole workgroup: another piece's expert
    }
#endif

#if defined(GROUPED) || defined(XQ)
    // 1. each pair's input row as quantize_q8.comp wrote it (MAXC = n_cols: XW and XB are its
    // row strides)
    uint sbase = (pc.n_pairs / pc.x_div) * XW;
    for (uint i = tid; i < nv * XW; i += WG) {
        uint j = i / XW;
        xq[i] = xg[(pair_of(j) / pc.x_div) * XW + (i - j * XW)];
    }
    for (uint i = tid; i < nv * XB; i += WG) {
        uint j = i / XB;
        uint si = sbase + 2u * ((pair_of(j) / pc.x_div) * XB + (i - j * XB));
        xs[i] = vec2(xgf[si], xgf[si + 1u]);
    }
#else
    // 1. q8 of each pair's input into shared memory
    for (uint i = tid; i < nv * nb; i += WG) {
        uint j = i / nb;
        uint b = i - j * nb;
#ifdef ABL_NOQ
        // (benchmark ablation, wrong results) x neither read nor quantized: what the products
        // cost with their inputs' codes already at hand
        xs[j * XB + b] = vec2(0.0);
        continue;
#endif
        uint xi = (pair_of(j) / pc.x_div) * xrow + b * 8u;
        vec4 v[8];
        [[unroll]] for (uint k = 0u; k < 8u; k++) {
            v[k] = x4[xi + k];
        }
        xs[j * XB + b] = q8_store(v, j * XW + b * 8u);
    }
#endif
    barrier();

    // 2. the rows: accumulator (k, j) of matrix k / RPT, row r0 + k % RPT, pair j
    uint rg = tid / TPR;
    uint lane = tid % TPR;
    uint r0 = (gl_WorkGroupID.x * GROUPS + rg) * RPT;
    uint expert_bytes = pc.n_rows * pc.row_bytes;
    uint base[NU];
    [[unroll]] for (uint j = 0u; j < NU; j++) {
#ifdef GROUPED
        base[j] = (e - pc.e_begin) * expert_bytes;
#else
        base[j] = (ids[p0 + j] - pc.e_begin) * expert_bytes;
#endif
    }
    float acc[NACC];
    [[unroll]] for (uint k = 0u; k < NACC; k++) {
        acc[k] = 0.0;
    }
    // rows past the end read the last
#ifdef KQUANT
    uint p = (lane % 8u) / 2u;
    uint h = lane % 2u;
    uint n_sb = pc.n_cols / 256u;
    uint rw = pc.row_bytes / 16u; // uvec4s a row
    for (uint sb = lane / 8u; sb < n_sb; sb += 4u) {
        uint blo = sb * 8u + 2u * p; // q8 blocks of the two sub-blocks
        uint wlo = blo * 8u + 4u * h;
        [[unroll]] for (uint k = 0u; k < NM * RPT; k++) {
            uint r = min(r0 + k % RPT, pc.n_rows - 1u);
            uint lo[4];
            uint hi[4];
            vec4 f;
            [[unroll]] for (uint j = 0u; j < NU; j++) {
                if (j >= nv) {
                    break; // a group's last run
                }
                if (j == 0u || !ONE_EXPERT) {
                    f = kq_decode(k / RPT, base[j] / 16u + r * rw + sb * SB_VECS, p, h, lo, hi);
                }
                acc[k * NU + j] += kq_dot(f, lo, hi, j * XW + wlo, j * XB + blo);
            }
        }
    }
#endif
#ifdef DOT_Q6_K
    uint n6 = (lane % 8u) / 4u; // lane (n, c) of the eight
    uint c6 = lane % 4u;
    uint n_sb = pc.n_cols / 256u;
    for (uint sb = lane / 8u; sb < n_sb; sb += 4u) {
        [[unroll]] for (uint k = 0u; k < NM * RPT; k++) {
            uint r = min(r0 + k % RPT, pc.n_rows - 1u);
            uint cw[8];
            int sc[4];
            float d;
            [[unroll]] for (uint j = 0u; j < NU; j++) {
                if (j >= nv) {
                    break; // a group's last run
                }
                if (j == 0u || !ONE_EXPERT) {
                    d = q6_decode(k / RPT, base[j] + r * pc.row_bytes + sb * 210u, n6, c6, cw, sc);
                }
                acc[k * NU + j] += d * q6_dot(cw, sc, j * XW, j * XB, sb * 8u + 4u * n6, c6);
            }
        }
    }
#endif
#ifdef BLOCK32
    for (uint bi = lane; bi < nb; bi += TPR) {
        [[unroll]] for (uint k = 0u; k < NM * RPT; k++) {
            uint r = min(r0 + k % RPT, pc.n_rows - 1u);
            uint cw[8];
            vec2 dm;
            [[unroll]] for (uint j = 0u; j < NU; j++) {
                if (j >= nv) {
                    break; // a group's last run
                }
                if (j == 0u || !ONE_EXPERT) {
                    dm = b32_decode(k / RPT, base[j] + r * pc.row_bytes + bi * BB, cw);
                }
                acc[k * NU + j] += b32_dot(dm, cw, j * XW + bi * 8u, j * XB + bi);
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
    if (lane >= RPT) {
        return;
    }
    uint r = r0 + lane;
    if (r >= pc.n_rows) {
        return;
    }
    bool add_bias = (pc.flags & 1u) != 0u;
    float v[NM * NU];
    [[unroll]] for (uint m = 0u; m < NM; m++) {
        [[unroll]] for (uint j = 0u; j < NU; j++) {
            float s = 0.0;
            for (uint i = 0u; i < per; i++) {
                s += part[(rg * per + i) * NACC + (m * RPT + lane) * NU + j];
            }
            v[m * NU + j] = s;
        }
    }
#ifdef COMBINE
    float tot = 0.0;
    [[unroll]] for (uint j = 0u; j < NU; j++) {
        uint p = p0 + j;
        float s = v[j];
        if (add_bias) {
            s += bias[ids[p] * pc.n_rows + r];
        }
        tot += wt[p] * s;
    }
    y[gl_WorkGroupID.y * pc.n_rows + r] += tot;
#else
    [[unroll]] for (uint j = 0u; j < NU; j++) {
        if (j >= nv) {
            break;
        }
        float s = v[j];
        if (add_bias) {
            s += bias[e * pc.n_rows + r];
        }
#ifdef GLU
        float s2 = v[NU + j];
        if (add_bias) {
            s2 += bias_u[e * pc.n_rows + r];
        }
        y[pair_of(j) * pc.n_rows + r] = moe_act(s, s2, pc.act, pc.alpha, pc.limit);
#else
        y[pair_of(j) * pc.n_rows + r] = s;
#endif
    }
#endif
}
