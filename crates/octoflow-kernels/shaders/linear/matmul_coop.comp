#version 450
// Quantized matrix-matrix product on cooperative matrices (VK_KHR_cooperative_matrix, f16 inputs,
// f32 accumulators), the batch (prefill) path on devices that have them:
//   y[t * y_stride + y_col + r] (= | +=) dot(W row r, x[t]) (+ bias[r]),  t < n_tokens, r < n_rows.
// W: n_rows rows in their GGUF encoding (quant.glsl, type from the QTYPE_* define), row r at byte
// r * row_bytes. x: [n_tokens, n_cols] f32. Both operands are rounded to f16 on their way to
// shared memory: the result is the product of the f16-rounded weights and inputs, summed in f32.
//
// Workgroup (x, y) = (row tile, token tile) computes C = W[BM rows] · x[BN tokens]ᵀ with WGS
// invocations: NSG subgroups of 32 in a WARPS_M x WARPS_N grid, each owning a (BM / WARPS_M) x
// (BN / WARPS_N) block of C as FM x FN accumulators of 16 x 16. Per step of BK columns every
// invocation issues the global loads of its share of the tiles into registers: the raw words of
// its 32-element W chunk(s) (quant.glsl's chunk_fetch, branch-free, constant trip) and its vec4s
// of x (f32). Nothing waits for those loads until the next step: after the products of step k,
// store_step decodes step k + 1's chunks (chunk_decode, arithmetic only), rounds W and x to f16
// and writes them to shared memory with 8-byte stores (`ws` [row][k], `xs` [token][k]: the B
// operand in column-major order), so the loads of step k + 1 are in flight while the subgroups
// multiply step k from shared memory (register double buffering), and the decode math runs
// after the products were issued instead of stalling them on the loads' latency. The
// cost that bounds this kernel is the per-element work of getting operands into shared memory,
// not the tensor cores: each weight is decoded once per token tile and each input loaded once
// per row tile, so the tiles are large (128 x 64) and the stores wide. Rows, tokens and columns
// past the ends are zero-filled. Results leave through a per-subgroup 16 x 16 staging tile so
// the y writes run along rows.
//
// GLU variants (GLU defined): the FFN's gate and up products of the same rows and tokens in one
// workgroup (up from binding 5, same type and shape; the W tile holds BM gate rows then BM up
// rows, every subgroup keeps both accumulator sets and shares the x fragments between them) and
// y = act(gate) * up (glu.glsl's op from flags >> 2) written once; never split-K. Benchmark-only
// defines: WH / XH read W / x as f16 already in memory (whole 16-byte rows), what a dequantized
// copy would cost; ABL_* take parts out (linear_bench.rs).
//
// x is read as vec4s when x_vec is set (n_cols a multiple of 4 and x's binding 16-byte aligned:
// the host checks), else one float at a time.
//
// Split-K: workgroup z = piece p covers columns [p * k_per, (p + 1) * k_per) (k_per a multiple of
// BK). With split > 1 each piece writes its raw sums to part[(p * n_tokens + t) * n_rows + r]
// and split_sum.comp adds the pieces into y (bias, accumulate); a small matrix then spreads over
// enough workgroups to fill the device instead of running its column steps one after another.
//
// MOE variants (MOE defined): the grouped expert products of a mixture of experts (the batch
// path of moe/experts.rs, with moe_matmul.comp's bindings, push constants and semantics):
// workgroup z = expert e_begin + z, its W rows from byte z * n_rows * row_bytes, the token tile
// = BN pairs of the expert's group (list[offsets[e] ...], moe_group.comp), each pair p's input
// row p / x_div gathered into the x tile and its output row p scattered from the staging tile:
// y[p * n_rows + r] = dot + bias[e * n_rows + r]; with GLU, moe_act(gate + b, up + b_up). Tiles
// past the group's end leave at once (the grid is sized for the largest possible group); no
// split-K (the products of one expert are few and the experts fill the grid).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

#define QWINDOW 1 // unrolled chunk fetch and decode: raw words in registers (quant.glsl)

#ifndef BM
#define BM 128u
#endif
#ifndef BN
#define BN 64u
#endif
#ifndef BK
#define BK 64u
#endif
#ifndef WARPS_M
#define WARPS_M 4u
#endif
#ifndef WARPS_N
#define WARPS_N 2u
#endif
#define NSG (WARPS_M * WARPS_N)
#define WGS (NSG * 32u)      // invocations
#define WM (BM / WARPS_M)    // rows per subgroup
#define WN (BN / WARPS_N)    // tokens per subgroup
#define FM (WM / 16u)        // accumulator tiles along rows
#define FN (WN / 16u)        // accumulator tiles along tokens
#define KCH (BK / 32u)       // W chunks per row per step
#define LDA ((BK + 8u) / 4u) // shared row stride in f16vec4s: 16-byte aligned rows, spread banks
#ifdef GLU
// Two matrices of BM rows each (gate rows [0, BM) of the W tile, up rows [BM, 2 BM)); the
// jobs of [0, BM * KCH) decode gate chunks, the rest up chunks (uniform per subgroup).
#define NMAT 2u
#else
#define NMAT 1u
#endif
#define JOBS ((NMAT * BM * KCH + WGS - 1u) / WGS) // W chunks per invocation per step
#define XV ((BN * BK / 4u + WGS - 1u) / WGS)  // x vec4s per invocation per step
#define WHJ ((BM * BK / 8u + WGS - 1u) / WGS) // WH: W uvec4s (8 halves) per invocation per step
#define XHJ ((BN * BK / 8u + WGS - 1u) / WGS) // XH: x uvec4s per invocation per step

layout(local_size_x = WGS) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 0) readonly buffer WH4 { uvec4 wh4[]; }; // WH: 8 f16 weights
layout(std430, binding = 1) readonly buffer XH4 { uvec4 xh4[]; }; // XH: 8 f16 inputs
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
#ifdef MOE
layout(std430, binding = 4) readonly buffer Off { uint offsets[]; };
layout(std430, binding = 5) readonly buffer List { uint list[]; };
#ifdef GLU
layout(std430, binding = 6) readonly buffer W2 { uint w2[]; };      // the up matrix
layout(std430, binding = 7) readonly buffer Bias2 { float bias2[]; }; // its biases
#endif

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint row_bytes;
    uint n_pairs;
    uint x_div;
    uint e_begin;
    uint e_count;
    uint flags; // bit 0: add the biases, bit 1: x is read as vec4s
    uint act;   // GLU: moe_act.glsl's op
    float alpha;
    float limit;
} pc;
#else
layout(std430, binding = 4) writeonly buffer Part { float part[]; };
#ifdef GLU
layout(std430, binding = 5) readonly buffer W2 { uint w2[]; }; // the up matrix
#endif

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
    uint x_vec; // 1: x is read as vec4s
} pc;
#endif

#include "quant.glsl"
#ifdef GLU
#define QSECOND
#include "quant.glsl" // chunk_fetch_2 / chunk_decode_2 read w2
#undef QSECOND
#ifdef MOE
#include "moe_act.glsl"
#else
#include "glu.glsl"
#endif
#endif

shared f16vec4 ws[NMAT * BM * LDA]; // W tile, [row][k] (GLU: gate rows, then up rows)
shared f16vec4 xs[BN * LDA];   // x tile, [token][k]
shared float cs[NSG * 256u];   // per-subgroup 16 x 16 output staging, [token][row]

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// The first byte of this workgroup's matrix rows (MOE: its expert's).
uint w_base = 0u;
#ifdef MOE
#define NONE 0xffffffffu
shared uint ent[BN]; // the token tile's pairs (NONE past the group's end)
#endif

// Registers of one step: the raw words of the W chunks this invocation decodes (quant.glsl's
// chunk_fetch) and its x vec4s.
#ifdef WH
uvec4 whreg[WHJ];
#else
uint wraw[JOBS][QRAW];
#endif
#ifdef XH
uvec4 xhreg[XHJ];
#else
vec4 xreg[XV];
#endif

// Job q of this invocation in step k0: row r and chunk c of W; whether they lie inside W (never
// with ABL_NODEQ: no weight loads, zero weights).
bool w_job(uint k0, uint tid, uint row0, uint nc, uint q, out uint r, out uint c) {
    uint job = (tid + WGS * q) % (BM * KCH);
    r = row0 + job / KCH;
    c = k0 / 32u + job % KCH;
#ifdef ABL_NODEQ
    return false;
#else
    return tid + WGS * q < NMAT * BM * KCH && r < pc.n_rows && c < nc;
#endif
}

#ifdef GLU
// Whether job q of this invocation decodes a chunk of the up matrix (else of the gate).
bool up_job(uint tid, uint q) {
    return tid + WGS * q >= BM * KCH;
}
#endif

// x vec4 q of this invocation in step k0 (zeros past the ends).
vec4 x_fetch(uint k0, uint tid, uint tok0, uint q, bool xvec) {
    uint e = tid + WGS * q;
    uint col = k0 + 4u * (e % (BK / 4u));
    vec4 v = vec4(0.0);
#ifdef MOE
    // the pair's input row (its token's where pairs share it)
    uint tl = e / (BK / 4u);
    uint p = tl < BN ? ent[tl] : NONE;
    uint t = p / pc.x_div;
    if (p != NONE) {
#else
    uint t = tok0 + e / (BK / 4u);
#ifdef ABL_NOX
    if (false) {
#else
    if (t < pc.n_tokens) {
#endif
#endif
        uint o = t * pc.n_cols + col;
        if (xvec) {
            if (col < pc.n_cols) {
                v = x4[o / 4u];
            }
        } else {
            [[unroll]] for (uint i = 0u; i < 4u; i++) {
                if (col + i < pc.n_cols) {
                    v[i] = x[o + i];
                }
            }
        }
    }
    return v;
}

// Issues the global loads of step k0's share of the tiles into wraw / xreg (zeros past the
// ends) and nothing that waits for them: the decoding is store_step's.
void load_step(uint k0, uint tid, uint row0, uint tok0, uint nc, bool xvec) {
#ifdef WH
    [[unroll]] for (uint q = 0u; q < WHJ; q++) {
        uint e = tid + WGS * q;
        uint r = row0 + e / (BK / 8u);
        uint col = k0 + 8u * (e % (BK / 8u));
        whreg[q] = uvec4(0u);
        if (e < BM * BK / 8u && r < pc.n_rows && col < pc.n_cols) {
            whreg[q] = wh4[(r * pc.row_bytes) / 16u + col / 8u];
        }
    }
#else
    [[unroll]] for (uint q = 0u; q < JOBS; q++) {
        uint r;
        uint c;
        if (w_job(k0, tid, row0, nc, q, r, c)) {
#ifdef GLU
            if (up_job(tid, q)) {
                chunk_fetch_2(w_base + r * pc.row_bytes, c, pc.n_cols, wraw[q]);
            } else
#endif
            chunk_fetch(w_base + r * pc.row_bytes, c, pc.n_cols, wraw[q]);
        } else {
            [[unroll]] for (uint i = 0u; i < QRAW; i++) {
                wraw[q][i] = 0u;
            }
        }
    }
#endif
#ifdef XH
    [[unroll]] for (uint q = 0u; q < XHJ; q++) {
        uint e = tid + WGS * q;
        uint t = tok0 + e / (BK / 8u);
        uint col = k0 + 8u * (e % (BK / 8u));
        xhreg[q] = uvec4(0u);
        if (e < BN * BK / 8u && t < pc.n_tokens && col < pc.n_cols) {
            xhreg[q] = xh4[(t * pc.n_cols + col) / 8u];
        }
    }
#else
    [[unroll]] for (uint q = 0u; q < XV; q++) {
        xreg[q] = x_fetch(k0, tid, tok0, q, xvec);
    }
#endif
}

// Decodes the W chunks of step k0 from wraw (zeros outside W) and writes them and the x vec4s,
// rounded to f16, to the shared tiles.
void store_step(uint k0, uint tid, uint row0, uint nc) {
#ifdef ABL_NOSTORE
    return;
#endif
#ifdef WH
    [[unroll]] for (uint q = 0u; q < WHJ; q++) {
        uint e = tid + WGS * q;
        if (e < BM * BK / 8u) {
            uint o = (e / (BK / 8u)) * LDA + 2u * (e % (BK / 8u));
            uvec4 u = whreg[q];
            ws[o] = f16vec4(unpackFloat2x16(u.x), unpackFloat2x16(u.y));
            ws[o + 1u] = f16vec4(unpackFloat2x16(u.z), unpackFloat2x16(u.w));
        }
    }
#endif
#ifdef XH
    [[unroll]] for (uint q = 0u; q < XHJ; q++) {
        uint e = tid + WGS * q;
        if (e < BN * BK / 8u) {
            uint o = (e / (BK / 8u)) * LDA + 2u * (e % (BK / 8u));
            uvec4 u = xhreg[q];
            xs[o] = f16vec4(unpackFloat2x16(u.x), unpackFloat2x16(u.y));
            xs[o + 1u] = f16vec4(unpackFloat2x16(u.z), unpackFloat2x16(u.w));
        }
    }
#endif
#ifndef WH
    [[unroll]] for (uint q = 0u; q < JOBS; q++) {
        uint job = tid + WGS * q;
        if (job < NMAT * BM * KCH) {
            uint r;
            uint c;
            float v[32];
            if (w_job(k0, tid, row0, nc, q, r, c)) {
#ifdef GLU
                if (up_job(tid, q)) {
                    chunk_decode_2(wraw[q], w_base + r * pc.row_bytes, c, pc.n_cols, v);
                } else
#endif
                chunk_decode(wraw[q], w_base + r * pc.row_bytes, c, pc.n_cols, v);
            } else {
                [[unroll]] for (uint i = 0u; i < 32u; i++) {
                    v[i] = 0.0;
                }
            }
            uint o = (job / KCH) * LDA + 8u * (job % KCH);
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                ws[o + i] = f16vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]);
            }
        }
    }
#endif
#ifndef XH
    [[unroll]] for (uint q = 0u; q < XV; q++) {
        uint e = tid + WGS * q;
        if (e < BN * BK / 4u) {
            xs[(e / (BK / 4u)) * LDA + e % (BK / 4u)] = f16vec4(xreg[q]);
        }
    }
#endif
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.x * BM;
    uint tok0 = gl_WorkGroupID.y * BN;
    uint sg = gl_SubgroupID;
    uint wm0 = (sg % WARPS_M) * WM;
    uint wn0 = (sg / WARPS_M) * WN;
#ifdef MOE
    uint expert = pc.e_begin + gl_WorkGroupID.z;
    uint first = offsets[expert];
    uint count = offsets[expert + 1u] - first;
    if (tok0 >= count) {
        return; // the whole workgroup: past this expert's group
    }
    w_base = gl_WorkGroupID.z * pc.n_rows * pc.row_bytes;
    if (tid < BN) {
        ent[tid] = tok0 + tid < count ? list[first + tok0 + tid] : NONE;
    }
    barrier();
    bool xvec = (pc.flags & 2u) != 0u;
#else
    bool xvec = pc.x_vec != 0u;
#endif

    ACC acc[FM][FN];
#ifdef GLU
    ACC acc2[FM][FN]; // the up product of the same rows and tokens
#endif
    [[unroll]] for (uint i = 0u; i < FM; i++) {
        [[unroll]] for (uint j = 0u; j < FN; j++) {
            acc[i][j] = ACC(0.0);
#ifdef GLU
            acc2[i][j] = ACC(0.0);
#endif
        }
    }

    uint nc = chunk_count(pc.n_cols);
#ifdef MOE
    uint kb = 0u;
    uint ke = pc.n_cols;
#else
    uint piece = gl_WorkGroupID.z;
    uint kb = piece * pc.k_per;
    uint ke = min(pc.n_cols, kb + pc.k_per);
#endif
    load_step(kb, tid, row0, tok0, nc, xvec);
    for (uint k0 = kb; k0 < ke; k0 += BK) {
        store_step(k0, tid, row0, nc);
#ifndef ABL_NOBAR
        barrier();
#endif
        if (k0 + BK < ke) {
            load_step(k0 + BK, tid, row0, tok0, nc, xvec);
        }
        [[unroll]] for (uint kk = 0u; kk < BK / 4u; kk += 4u) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[FM];
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[FN];
            [[unroll]] for (uint i = 0u; i < FM; i++) {
                coopMatLoad(a[i], ws, (wm0 + 16u * i) * LDA + kk, LDA,
                            gl_CooperativeMatrixLayoutRowMajor);
            }
            [[unroll]] for (uint j = 0u; j < FN; j++) {
                coopMatLoad(b[j], xs, (wn0 + 16u * j) * LDA + kk, LDA,
                            gl_CooperativeMatrixLayoutColumnMajor);
            }
#ifndef ABL_NOMMA
            [[unroll]] for (uint i = 0u; i < FM; i++) {
                [[unroll]] for (uint j = 0u; j < FN; j++) {
                    acc[i][j] = coopMatMulAdd(a[i], b[j], acc[i][j]);
                }
            }
#endif
#ifdef GLU
            [[unroll]] for (uint i = 0u; i < FM; i++) {
                coopMatLoad(a[i], ws, (BM + wm0 + 16u * i) * LDA + kk, LDA,
                            gl_CooperativeMatrixLayoutRowMajor);
            }
            [[unroll]] for (uint i = 0u; i < FM; i++) {
                [[unroll]] for (uint j = 0u; j < FN; j++) {
                    acc2[i][j] = coopMatMulAdd(a[i], b[j], acc2[i][j]);
                }
            }
#endif
        }
#ifndef ABL_NOBAR
        barrier();
#endif
    }

    uint lane = gl_SubgroupInvocationID;
    uint base = sg * 256u;
    bool add_bias = (pc.flags & 1u) != 0u;
#ifdef MOE
    [[unroll]] for (uint i = 0u; i < FM; i++) {
        [[unroll]] for (uint j = 0u; j < FN; j++) {
            coopMatStore(acc[i][j], cs, base, 16u, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
#ifdef GLU
            // the raw gate sums kept in registers while the up tile takes the staging area
            float ga[8];
            [[unroll]] for (uint e0 = 0u; e0 < 256u; e0 += 32u) {
                ga[e0 / 32u] = cs[base + e0 + lane];
            }
            subgroupBarrier();
            coopMatStore(acc2[i][j], cs, base, 16u, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
#endif
            [[unroll]] for (uint e0 = 0u; e0 < 256u; e0 += 32u) {
                uint e = e0 + lane;
                uint r = row0 + wm0 + 16u * i + e % 16u;
                uint p = ent[wn0 + 16u * j + e / 16u];
                if (r < pc.n_rows && p != NONE) {
                    uint b = expert * pc.n_rows + r;
#ifdef GLU
                    float g = ga[e0 / 32u] + (add_bias ? bias[b] : 0.0);
                    float u = cs[base + e] + (add_bias ? bias2[b] : 0.0);
                    y[p * pc.n_rows + r] = moe_act(g, u, pc.act, pc.alpha, pc.limit);
#else
                    y[p * pc.n_rows + r] = cs[base + e] + (add_bias ? bias[b] : 0.0);
#endif
                }
            }
            subgroupBarrier();
        }
    }
#else
    bool accumulate = (pc.flags & 2u) != 0u;
    // Constant indices only (every loop unrolled): an accumulator array indexed by a loop
    // variable lives in local memory, and every product then goes through it (measured on the
    // H100: 8x slower).
    [[unroll]] for (uint i = 0u; i < FM; i++) {
        [[unroll]] for (uint j = 0u; j < FN; j++) {
            // Column-major store: cs[base + 16 n + m] = C[m][n] (row m, token n).
#ifdef GLU
            // the gate's tile through the staging area first, kept in registers as act(gate)
            coopMatStore(acc[i][j], cs, base, 16u, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            float ga[8];
            [[unroll]] for (uint e0 = 0u; e0 < 256u; e0 += 32u) {
                ga[e0 / 32u] = glu_act(cs[base + e0 + lane], pc.flags >> 2u);
            }
            subgroupBarrier();
            coopMatStore(acc2[i][j], cs, base, 16u, gl_CooperativeMatrixLayoutColumnMajor);
#else
            coopMatStore(acc[i][j], cs, base, 16u, gl_CooperativeMatrixLayoutColumnMajor);
#endif
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint e0 = 0u; e0 < 256u; e0 += 32u) {
                uint e = e0 + lane;
                uint r = row0 + wm0 + 16u * i + e % 16u;
                uint t = tok0 + wn0 + 16u * j + e / 16u;
#ifdef GLU
                // act(gate) * up; one piece (no split-K: the activation is not linear)
                if (r < pc.n_rows && t < pc.n_tokens) {
                    y[t * pc.y_stride + pc.y_col + r] = ga[e0 / 32u] * cs[base + e];
                }
                continue;
#endif
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
#endif
}
