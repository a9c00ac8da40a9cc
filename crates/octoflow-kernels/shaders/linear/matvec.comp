#version 450
// Quantized matrix-vector product for a few tokens (the decode hot path):
//   y[t * y_stride + y_col + r] (= | +=) dot(W row r, x[t]) (+ bias[r]),  t < n_tokens <= MAXT.
// W: n_rows rows in their GGUF encoding (quant.glsl, type from the QTYPE_* define), row r at byte
// r * row_bytes. x: [n_tokens, n_cols] f32. TPR invocations per group of RPT rows (layout
// below); each invocation strides over the row's 32-element chunks (consecutive invocations read
// consecutive blocks), dequantizes a chunk once and uses it for every token. Reduction: subgroup
// sums, then the per-subgroup partials of a row through shared memory (the host guarantees the
// subgroup size divides TPR). Workgroups form a 2-D grid flattened as in common.glsl.
// Two or four tokens (MAXT 2, 4; rows of whole chunks): the workgroup stages x (times the norm
// weight) in shared memory 32 chunks at a time and each lane takes one chunk of the tile: every
// lane reading its own chunk of x from global memory touches a different cache line per load,
// and that cost grew with the tokens (qwen's decode step on the H100: 5.3 ms for 8 rows).
// Measured on the H100 (docs/perf-log/): branch-free windowed weight reads (QWINDOW) and x
// read as vec4s (a chunk of x is 16-byte aligned: n_cols is a multiple of 32 for every block
// type) take the kernel from ~110 to ~215 GB/s on qwen's 4864x896 Q5_0 and from 167 to ~800 GB/s
// on its 151936x896 Q8_0 output matrix.
//
// GLU variants (GLU defined: matvec_glu_<type>): the gated linear unit of an FFN in one dispatch,
//   y[t * y_stride + y_col + r] = act(dot(W row r, x[t])) * dot(W2 row r, x[t]),
// W the gate matrix (binding 0), W2 the up matrix (binding 5, same type and shape), act = SiLU
// or GELU-tanh (push constant `act`, glu.glsl). Each chunk of x is read once for both rows; both
// chunks are dequantized. Bias and accumulate do not apply (flags ignored); the fused norm does
// (both products are of rms_norm(x[t]) * g).
//
// Pending post-norm (specialization constant PEND, one-token pipelines, fused norm, n_cols a
// multiple of 32): the input is x + rms_norm(p) * gp, a residual stream whose last block's post-norm (gemma3)
// was left to its consumer. The product is linear in it, so the loop keeps the dots with x and
// with p * gp apart, and the sums of squares the two norms need (p^2; x^2, x.(p gp), (p gp)^2),
// and combines them at the end: no extra pass, no barrier. Bit 1 of `pend` also writes the input
// (the settled residual) to xo, spread over the workgroups.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#define QWINDOW 1 // unrolled chunk fetch and decode: raw words in registers (quant.glsl)
#define QPAIRS 1  // q4k_pair_dot, the block layout's Q4_K decode (quant.glsl)

// Work layout (specialization constants, chosen per matrix shape by linear.rs): WG invocations
// per workgroup; TPR invocations per group of RPT consecutive rows (TPR a multiple of the
// subgroup size dividing WG); each invocation reads the same chunk of x for its RPT rows (more
// weight bytes in flight per invocation, x read once from memory per RPT rows); GROUPS = WG / TPR
// row groups, GROUPS * RPT rows per workgroup; at most MAXT tokens (the pipeline for one token keeps one
// accumulator per row).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128u;
layout(constant_id = 1) const uint TPR = 32u;
layout(constant_id = 2) const uint MAXT = 8u;
layout(constant_id = 3) const uint RPT = 1u;
// 1: the pipeline has the pending post-norm path (one token; shared memory and registers only
// where it is used)
layout(constant_id = 4) const uint PEND = 0u;
// 1: the block layout (Q4_K only; one token, no pending post-norm, rows of whole pairs of
// super-blocks at 16-byte aligned offsets, all checked by the host): each invocation takes 64
// elements of a row at a time — a super-block's 16-byte head and 32 bytes of codes, three
// 16-byte loads — with those 64 elements of x held in registers for its RPT rows, in place of
// a 32-element chunk's twelve word loads (two lanes of a pair load the same code bytes).
layout(constant_id = 5) const uint SB = 0u;
const uint GROUPS = WG / TPR; // row groups per workgroup

#include "common.glsl"

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) readonly buffer G { float g[]; };
layout(std430, binding = 4) readonly buffer G4 { vec4 g4[]; };
layout(std430, binding = 0) readonly buffer W4 { uvec4 w4[]; };
#ifdef GLU
layout(std430, binding = 5) readonly buffer W2 { uint w2[]; };
layout(std430, binding = 5) readonly buffer W24 { uvec4 w24[]; };
#define PB 6
#else
#define PB 5
#endif
layout(std430, binding = PB) readonly buffer P { float p[]; };
layout(std430, binding = PB) readonly buffer P4 { vec4 p4[]; };
layout(std430, binding = PB + 1) readonly buffer GP { float gp[]; };
layout(std430, binding = PB + 1) readonly buffer GP4 { vec4 gp4[]; };
layout(std430, binding = PB + 2) writeonly buffer XO { float xo[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint n_tokens;
    uint y_stride;
    uint y_col;
    uint row_bytes;
    uint flags; // bit 0: add bias, bit 1: accumulate into y
    float eps;
    uint norm;  // 1: the input is rms_norm(x[t]) * g (RMSNorm fused: x scaled by g here, by
                // 1/rms at the end)
#ifdef GLU
    uint act;   // glu.glsl's op: 0 SiLU, 1 GELU-tanh
#endif
    uint pend;  // with PEND: bit 0 set (the input is x + rms_norm(p) * gp, eps as the norm's);
                // bit 1: write it to xo
} pc;

#include "quant.glsl"
#ifdef GLU
#define QSECOND
#include "quant.glsl" // dequant_chunk_2 reads w2
#undef QSECOND
#include "glu.glsl"
#endif

// Per-subgroup partial sums (at most WG subgroups): the products [MAXT][RPT][WG], then (fused
// norm) the sums of squares of x [MAXT][WG], then (GLU) the up products [MAXT][RPT][WG]; then
// the pending post-norm's dots with p * gp (gate, and up for GLU) [RPT][WG] and its three sums
// [3][WG] (one token).
#ifdef GLU
#define NMAT 2u
#else
#define NMAT 1u
#endif
#define NPART (NMAT * MAXT * RPT + MAXT + PEND * (NMAT * RPT + 3u))
// Staged x (pipelines for 2 or 4 tokens): a tile of XS_CHUNKS chunks of every token's x (times
// the norm weight), XS_CHUNKS * 8 vec4 per token, the vec4 i of chunk c at slot i ^ (c & 7) so
// that the 8 lanes of a 128-byte shared-memory access read 8 different slots. The partial sums
// of those pipelines share its memory (written after the last tile): more workgroups per SM,
// which the H100 needed (4-token steps 3.5 -> 3.0 ms). Pipelines for 8 tokens read x from
// global memory: a 32 KB tile left too few workgroups per SM to hide the weight reads.
const uint XS_CHUNKS = 32u;
const uint STAGED = (MAXT > 1u && MAXT <= 4u) ? 1u : 0u;
const uint SH_PART = NPART * WG;
const uint SH_XS = MAXT * XS_CHUNKS * 8u;
shared float partial[STAGED != 0u ? 1u : SH_PART];
shared vec4 xs[STAGED != 0u ? (SH_XS > SH_PART / 4u ? SH_XS : SH_PART / 4u) : 1u];

// The slot of vec4 i of chunk c of token t in the staged tile.
uint xs_slot(uint t, uint c, uint i) {
    return (t * XS_CHUNKS + c) * 8u + (i ^ (c & 7u));
}

float part(uint i) {
    if (STAGED != 0u) {
        return xs[i >> 2][i & 3u];
    }
    return partial[i];
}

void part_set(uint i, float v) {
    if (STAGED != 0u) {
        xs[i >> 2][i & 3u] = v;
    } else {
        partial[i] = v;
    }
}
#define P_ACC(t, k) (((t) * RPT + (k)) * WG)
#define P_SSQ(t) ((MAXT * RPT + (t)) * WG)
#define P_UP(t, k) ((MAXT * RPT + MAXT + (t) * RPT + (k)) * WG)
#define P_PEND (NMAT * MAXT * RPT + MAXT)
#define P_PACC(k) ((P_PEND + (k)) * WG)
#define P_PUP(k) ((P_PEND + RPT + (k)) * WG)
#define P_PSUM(j) ((P_PEND + NMAT * RPT + (j)) * WG)

// The pending post-norm's scale 1/rms(p) from the sums of squares of p that the row group at
// partial index `first` (per_row subgroups) left in shared memory.
float pend_scale(uint first, uint per_row) {
    float spp = 0.0;
    for (uint j = 0u; j < per_row; j++) {
        spp += part(P_PSUM(0u) + first + j);
    }
    return 1.0 / sqrt(spp / float(pc.n_cols) + pc.eps);
}

void main() {
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint tid = gl_LocalInvocationID.x;
    uint lr = tid / TPR;
    uint lane = tid % TPR;
    uint r0 = (group * GROUPS + lr) * RPT;
    uint nt = min(pc.n_tokens, MAXT);

    float acc[MAXT * RPT];
#ifdef GLU
    float acc2[MAXT * RPT];
#endif
    [[unroll]] for (uint i = 0u; i < MAXT * RPT; i++) {
        acc[i] = 0.0;
#ifdef GLU
        acc2[i] = 0.0;
#endif
    }
    // Fused norm: the lanes of a row group read all of x[t] between them, so each sums x[t]^2 in
    // the same loop as its dot products (no extra pass, no barrier) and scales by 1/rms at the
    // end.
    bool norm = pc.norm != 0u;
    float ssq[MAXT];
    [[unroll]] for (uint t = 0u; t < MAXT; t++) {
        ssq[t] = 0.0;
    }
    // pending post-norm (one token): dots with q = p * gp (times g), and sum(p^2), sum(x.q),
    // sum(q^2)
    bool pend = PEND != 0u && MAXT == 1u;
    float pacc[RPT];
#ifdef GLU
    float pacc2[RPT];
#endif
    [[unroll]] for (uint k = 0u; k < RPT; k++) {
        pacc[k] = 0.0;
#ifdef GLU
        pacc2[k] = 0.0;
#endif
    }
    vec3 psum = vec3(0.0);
    // Several tokens, whole chunks: x read from shared memory (every invocation takes part in
    // the staging and its barriers, rows or not). The sums of squares are of the elements each
    // invocation staged: the whole workgroup's add up to each token's.
    bool staged = STAGED != 0u && (pc.n_cols & 31u) == 0u;
    if (SB != 0u) {
#ifdef QTYPE_Q4_K
        // the block layout: unit u is elements [64u, 64u + 64), pair u % 4 of super-block u / 4
        uint nu = pc.n_cols >> 6;
        uint rv = pc.row_bytes >> 4; // row stride in 16-byte words
        for (uint u = lane; r0 < pc.n_rows && u < nu; u += TPR) {
            vec4 xv[16];
            vec2 sx = vec2(0.0);
            [[unroll]] for (uint i = 0u; i < 16u; i++) {
                xv[i] = x4[16u * u + i];
                if (norm) {
                    ssq[0] += dot(xv[i], xv[i]);
                    xv[i] *= g4[16u * u + i];
                }
                sx[i >> 3] += (xv[i].x + xv[i].y) + (xv[i].z + xv[i].w);
            }
            uint p = u & 3u;
            uint hb = (u >> 2) * 9u; // 144-byte super-blocks
            [[unroll]] for (uint k = 0u; k < RPT; k++) {
                uint r = r0 + k;
                if (r >= pc.n_rows) {
                    break;
                }
                uint b = r * rv + hb;
                acc[k] += q4k_pair_dot(w4[b], w4[b + 1u + 2u * p], w4[b + 2u + 2u * p], p, xv, sx);
#ifdef GLU
                acc2[k] += q4k_pair_dot(w24[b], w24[b + 1u + 2u * p], w24[b + 2u + 2u * p], p, xv, sx);
#endif
            }
        }
#endif
    } else if (staged) {
        uint nc = pc.n_cols >> 5;
        for (uint cb = 0u; cb < nc; cb += XS_CHUNKS) {
            uint tc = min(XS_CHUNKS, nc - cb);
            barrier(); // the last tile's reads are done
            for (uint j = tid; j < tc * 8u; j += WG) {
                uint c = j >> 3;
                uint i = j & 7u;
                vec4 gv = norm ? g4[8u * (cb + c) + i] : vec4(1.0);
                [[unroll]] for (uint t = 0u; t < MAXT; t++) {
                    if (t < nt) {
                        vec4 xv = x4[((t * pc.n_cols) >> 2) + 8u * (cb + c) + i];
                        ssq[t] += dot(xv, xv);
                        xs[xs_slot(t, c, i)] = xv * gv;
                    }
                }
            }
            barrier();
            uint c = lane;
            if (r0 < pc.n_rows && c < tc) {
                [[unroll]] for (uint k = 0u; k < RPT; k++) {
                    uint r = r0 + k;
                    if (r >= pc.n_rows) {
                        break;
                    }
                    uint rb = r * pc.row_bytes;
                    float v[32];
                    dequant_chunk(rb, cb + c, pc.n_cols, v);
#ifdef GLU
                    float v2[32];
                    dequant_chunk_2(rb, cb + c, pc.n_cols, v2);
#endif
                    [[unroll]] for (uint t = 0u; t < MAXT; t++) {
                        if (t >= nt) {
                            break;
                        }
                        float s = 0.0;
#ifdef GLU
                        float s2 = 0.0;
#endif
                        [[unroll]] for (uint i = 0u; i < 8u; i++) {
                            vec4 xv = xs[xs_slot(t, c, i)];
                            s += dot(vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]), xv);
#ifdef GLU
                            s2 += dot(vec4(v2[4u * i], v2[4u * i + 1u], v2[4u * i + 2u], v2[4u * i + 3u]), xv);
#endif
                        }
                        acc[t * RPT + k] += s;
#ifdef GLU
                        acc2[t * RPT + k] += s2;
#endif
                    }
                }
            }
        }
        barrier(); // the partial sums below reuse the staging memory
    } else if (r0 < pc.n_rows) {
        uint nc = chunk_count(pc.n_cols);
        for (uint c = lane; c < nc; c += TPR) {
            uint len = chunk_len(c, pc.n_cols);
            if (MAXT == 1u && len == 32u && (pc.n_cols & 3u) == 0u) {
                // One token: the chunk of x (normed) is read once into registers and serves all
                // RPT rows (below, every row reads it again, and x and g outweigh the weights
                // 8 to 1 in cache traffic).
                vec4 xv[8];
                vec4 qv[8];
                [[unroll]] for (uint i = 0u; i < 8u; i++) {
#ifdef ABL_NOX
                    xv[i] = vec4(float(c + i) * 1e-3); // benchmark ablation: no x (or g) reads
                    continue;
#endif
                    xv[i] = x4[8u * c + i];
                    if (pend) {
                        vec4 pv = p4[8u * c + i];
                        qv[i] = pv * gp4[8u * c + i];
                        psum += vec3(dot(pv, pv), dot(xv[i], qv[i]), dot(qv[i], qv[i]));
                    }
                    if (norm) {
                        ssq[0] += dot(xv[i], xv[i]);
                        xv[i] *= g4[8u * c + i];
                        if (pend) {
                            qv[i] *= g4[8u * c + i];
                        }
                    }
                }
                [[unroll]] for (uint k = 0u; k < RPT; k++) {
                    uint r = r0 + k;
                    if (r >= pc.n_rows) {
                        break;
                    }
                    uint rb = r * pc.row_bytes;
                    float v[32];
#ifdef GLU
                    float v2[32];
#endif
#ifdef ABL_NOW
                    // benchmark ablation: no weight reads
                    [[unroll]] for (uint i = 0u; i < 32u; i++) {
                        v[i] = float(i + c + k) * 1e-3;
#ifdef GLU
                        v2[i] = float(i + c) * 2e-3;
#endif
                    }
#else
                    dequant_chunk(rb, c, pc.n_cols, v);
#ifdef GLU
                    dequant_chunk_2(rb, c, pc.n_cols, v2);
#endif
#endif
                    float s = 0.0;
#ifdef GLU
                    float s2 = 0.0;
#endif
                    [[unroll]] for (uint i = 0u; i < 8u; i++) {
                        s += dot(vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]), xv[i]);
#ifdef GLU
                        s2 += dot(vec4(v2[4u * i], v2[4u * i + 1u], v2[4u * i + 2u], v2[4u * i + 3u]), xv[i]);
#endif
                    }
                    acc[k] += s;
#ifdef GLU
                    acc2[k] += s2;
#endif
                    if (pend) {
                        float ps = 0.0;
#ifdef GLU
                        float ps2 = 0.0;
#endif
                        [[unroll]] for (uint i = 0u; i < 8u; i++) {
                            ps += dot(vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]), qv[i]);
#ifdef GLU
                            ps2 += dot(vec4(v2[4u * i], v2[4u * i + 1u], v2[4u * i + 2u], v2[4u * i + 3u]), qv[i]);
#endif
                        }
                        pacc[k] += ps;
#ifdef GLU
                        pacc2[k] += ps2;
#endif
                    }
                }
                continue;
            }
            [[unroll]] for (uint k = 0u; k < RPT; k++) {
                uint r = r0 + k;
                if (r >= pc.n_rows) {
                    break;
                }
                uint rb = r * pc.row_bytes;
                float v[32];
                dequant_chunk(rb, c, pc.n_cols, v);
#ifdef GLU
                float v2[32];
                dequant_chunk_2(rb, c, pc.n_cols, v2);
#endif
                [[unroll]] for (uint t = 0u; t < MAXT; t++) {
                    if (t >= nt) {
                        break;
                    }
                    uint xb = t * pc.n_cols + 32u * c;
                    float s = 0.0;
#ifdef GLU
                    float s2 = 0.0;
#endif
                    if (len == 32u && (pc.n_cols & 3u) == 0u) {
                        // xb is a multiple of 4: the chunk is 8 aligned vec4s
                        [[unroll]] for (uint i = 0u; i < 8u; i++) {
                            vec4 xv = x4[(xb >> 2) + i];
                            if (norm) {
                                if (k == 0u) {
                                    ssq[t] += dot(xv, xv);
                                }
                                xv *= g4[8u * c + i];
                            }
                            s += dot(vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]), xv);
#ifdef GLU
                            s2 += dot(vec4(v2[4u * i], v2[4u * i + 1u], v2[4u * i + 2u], v2[4u * i + 3u]), xv);
#endif
                        }
                    } else {
                        for (uint i = 0u; i < len; i++) {
                            float xv = x[xb + i];
                            if (norm) {
                                if (k == 0u) {
                                    ssq[t] += xv * xv;
                                }
                                xv *= g[32u * c + i];
                            }
                            s += v[i] * xv;
#ifdef GLU
                            s2 += v2[i] * xv;
#endif
                        }
                    }
                    acc[t * RPT + k] += s;
#ifdef GLU
                    acc2[t * RPT + k] += s2;
#endif
                }
            }
        }
    }

    // Subgroup sums, then the TPR / gl_SubgroupSize partials of each row group.
    if (pend) {
        vec3 ps = subgroupAdd(psum);
        if (subgroupElect()) {
            part_set(P_PSUM(0u) + gl_SubgroupID, ps.x);
            part_set(P_PSUM(1u) + gl_SubgroupID, ps.y);
            part_set(P_PSUM(2u) + gl_SubgroupID, ps.z);
        }
        [[unroll]] for (uint k = 0u; k < RPT; k++) {
            float s = subgroupAdd(pacc[k]);
#ifdef GLU
            float s2 = subgroupAdd(pacc2[k]);
#endif
            if (subgroupElect()) {
                part_set(P_PACC(k) + gl_SubgroupID, s);
#ifdef GLU
                part_set(P_PUP(k) + gl_SubgroupID, s2);
#endif
            }
        }
    }
    [[unroll]] for (uint t = 0u; t < MAXT; t++) {
        if (t >= nt) {
            break;
        }
        float q = norm ? subgroupAdd(ssq[t]) : 0.0;
        if (subgroupElect()) {
            part_set(P_SSQ(t) + gl_SubgroupID, q);
        }
        [[unroll]] for (uint k = 0u; k < RPT; k++) {
            float s = subgroupAdd(acc[t * RPT + k]);
#ifdef GLU
            float s2 = subgroupAdd(acc2[t * RPT + k]);
#endif
            if (subgroupElect()) {
                part_set(P_ACC(t, k) + gl_SubgroupID, s);
#ifdef GLU
                part_set(P_UP(t, k) + gl_SubgroupID, s2);
#endif
            }
        }
    }
    barrier();
    if (lane == 0u && r0 < pc.n_rows) {
        uint per_row = TPR / gl_SubgroupSize;
        uint first = lr * per_row;
        [[unroll]] for (uint t = 0u; t < MAXT; t++) {
            if (t >= nt) {
                break;
            }
            float ss = 0.0;
            // staged: every subgroup staged part of x; else the row group's lanes read all of it
            uint sfirst = staged ? 0u : first;
            uint scount = staged ? WG / gl_SubgroupSize : per_row;
            for (uint j = 0u; j < scount; j++) {
                ss += part(P_SSQ(t) + sfirst + j);
            }
            // pending: the input's sum of squares from x^2, x.q and q^2 with q scaled by 1/rms(p)
            float pinv = pend ? pend_scale(first, per_row) : 0.0;
            if (pend) {
                float sxq = 0.0;
                float sqq = 0.0;
                for (uint j = 0u; j < per_row; j++) {
                    sxq += part(P_PSUM(1u) + first + j);
                    sqq += part(P_PSUM(2u) + first + j);
                }
                ss += pinv * (2.0 * sxq + pinv * sqq);
            }
            float inv = norm ? 1.0 / sqrt(ss / float(pc.n_cols) + pc.eps) : 1.0;
            [[unroll]] for (uint k = 0u; k < RPT; k++) {
                uint r = r0 + k;
                if (r >= pc.n_rows) {
                    break;
                }
                float s = 0.0;
                float ps = 0.0;
                for (uint j = 0u; j < per_row; j++) {
                    s += part(P_ACC(t, k) + first + j);
                    ps += pend ? part(P_PACC(k) + first + j) : 0.0;
                }
                s += pinv * ps;
#ifdef GLU
                float s2 = 0.0;
                float ps2 = 0.0;
                for (uint j = 0u; j < per_row; j++) {
                    s2 += part(P_UP(t, k) + first + j);
                    ps2 += pend ? part(P_PUP(k) + first + j) : 0.0;
                }
                s2 += pinv * ps2;
                y[t * pc.y_stride + pc.y_col + r] = glu_act(s * inv, pc.act) * (s2 * inv);
#else
                if (norm) {
                    s *= inv;
                }
                if ((pc.flags & 1u) != 0u) {
                    s += bias[r];
                }
                uint o = t * pc.y_stride + pc.y_col + r;
                if ((pc.flags & 2u) != 0u) {
                    s += y[o];
                }
                y[o] = s;
#endif
            }
        }
    }
    // the settled residual x + rms_norm(p) * gp, by the workgroups that hold rows (their first
    // row group read all of x and p)
    uint nvalid = (pc.n_rows + GROUPS * RPT - 1u) / (GROUPS * RPT);
    if (pend && (pc.pend & 2u) != 0u && group < nvalid) {
        float pinv = pend_scale(0u, TPR / gl_SubgroupSize);
        for (uint i = group * WG + tid; i < pc.n_cols; i += nvalid * WG) {
            xo[i] = x[i] + p[i] * pinv * gp[i];
        }
    }
}
