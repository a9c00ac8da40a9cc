#version 450
// Causal attention of a run of query tokens (prefill) on cooperative matrices
// (VK_KHR_cooperative_matrix, f16 operands, f32 accumulators), for heads of width D (64 or 128;
// the same width for keys and values). Same operands and meaning as attention.comp in run mode:
//   q [n_tokens, n_head, D], k and v [n_kv_rows, n_head_kv, D], out [n_tokens, n_head, D], f32;
//   query t sits at p = pos[pos_offset] + t and sees keys j in [first, min(p, n_kv_rows - 1)],
//   first = p + 1 - window when windowed (else 0); query head h reads KV head
//   h / (n_head / n_head_kv). A query that sees no key gets zeros.
// q, k and v are rounded to f16 on their way to shared memory, and so are the softmax weights
// before they multiply v; scores, their maximum and sum and the output accumulate in f32.
//
// Workgroup (x, y) = (tile of BR = 64 tokens, query head y): 4 subgroups of 32, each owning 16
// tokens, whose q rows stay in registers as D / 16 A fragments. Keys go by blocks of BC rows,
// every K and V block loaded once into shared memory for the whole workgroup. One pass over the
// workgroup's key range (flash attention): each block's scores, then its softmax weights
// exp(s - m) (f16, in shared memory) against a running row maximum m, then weights x V into
// cooperative-matrix accumulators. A cooperative matrix's layout is opaque, so the output's rows
// cannot be rescaled in registers whenever m grows; m therefore lags the true maximum by at most
// GROW (weights stay below 2^GROW, exact in f16), and only a block that passes it by more makes
// the subgroup rescale its accumulators through shared memory — at the first blocks of a row,
// rarely later. Scores pass through shared memory (each subgroup's 16 x BC tile) where two lanes
// per row apply the scale, the causal / window mask and the softmax. The output is divided by
// l on its way out.
//
// Split-K (flash decoding): workgroup z = piece s of n_split covers an even share of the tile's
// key blocks (the range is known only here: positions are read on the GPU). With n_split > 1
// each piece writes its unnormalized accumulators and (m, l) to `part` in attention_merge.comp's
// layout — rows r = t * n_head + h; part[(r * n_split + s) * D + d], then (m, l) at
// part[n_rows * n_split * D + 2 * (r * n_split + s)] — and the merge pass combines them: the
// causal tiles near the end of a run hold many more key blocks than the first ones, and one
// workgroup per tile would leave the device mostly idle.
//
// Sinks (has_sinks, gpt-oss): head h's denominator also counts exp(sinks[h] - m), a column with
// no value (llama.cpp's soft_max with sinks), added where the output is divided by l (with one
// piece; else in the merge).
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_GOOGLE_include_directive : require
#include "kv.glsl"

#ifndef D
#define D 64u
#endif
#ifndef BC
#define BC 64u
#endif
#define NSG 4u
#define WGS (32u * NSG)
#define BR (16u * NSG)        // tokens per workgroup
#define D4 (D / 4u)           // vec4s per head row
#define LD ((D + 8u) / 4u)    // shared stride of q/k/v rows, f16vec4s (16-byte aligned rows)
#define LDP ((BC + 8u) / 4u)  // shared stride of weight rows, f16vec4s
#define FD (D / 16u)          // 16-wide slices of a head
#define FC (BC / 16u)         // 16-key slices of a block
#define HALF (BC / 2u)        // keys of a block per lane (two lanes per row)
#define SS (BC + 1u)          // shared stride of score rows: lanes of one key index, 16 rows
                              // apart, fall in different banks (BC alone: a 16-way conflict)
#define NEG_BIG -1.0e30       // "nothing seen yet": finite, so exp(NEG_BIG - NEG_BIG) = 1
#define LOG2E 1.4426950408889634
#define GROW 11.0             // how far (in log2 units) a block's maximum may pass m before the
                              // rescale: weights stay below 2^11, far inside f16's range

layout(local_size_x = WGS) in;

layout(std430, binding = 0) readonly buffer Q4 { vec4 q4[]; };
layout(std430, binding = 1) readonly buffer K4 { KV4_T k4[]; };
layout(std430, binding = 2) readonly buffer V4 { KV4_T v4[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(std430, binding = 4) readonly buffer P { uint pos[]; };
layout(std430, binding = 5) writeonly buffer Part { float part[]; };
layout(std430, binding = 6) readonly buffer S { float sinks[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_head;
    uint n_head_kv;
    uint n_kv_rows;
    uint window;
    uint pos_offset;
    float scale;
    uint n_split;
    uint has_sinks;
} pc;

// K block at [0, BC * LD), V block at [BC * LD, 2 * BC * LD); the q tile (BR rows) before the
// loop (BR <= 2 * BC).
shared f16vec4 kv[2u * BC * LD];
shared float ss[NSG * 16u * SS];   // per-subgroup scores [row][key]; the output's staging
shared f16vec4 ps[NSG * 16u * LDP]; // per-subgroup weights [row][key]

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MATA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MATB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>

// The next block's keys and values travel in registers while the current one is computed
// (PER 4-vectors of each per lane), as stored in the cache; they are decoded, zeroed past the
// range and rounded to f16 on their way to shared memory.
#define PER (BC * D4 / WGS)
#ifdef KV_Q8
#define PRE_T uvec2 // a word of four int8s and its block's scale
#define PRE_LD(buf, g) uvec2(buf[((g) >> 3u) * 9u + 1u + ((g) & 7u)], buf[((g) >> 3u) * 9u])
#define PRE_VAL(p_) (q8_unpack((p_).x) * uintBitsToFloat((p_).y))
#else
#define PRE_T KV4_T
#define PRE_LD(buf, g) buf[g]
#define PRE_VAL(x) vec4(x)
#endif
PRE_T kpre[PER];
PRE_T vpre[PER];

// Starts loading keys and values [kb, kb + BC) of KV head hk (rows past `kend` read the last
// one; store_block zeros them).
void fetch_block(uint kb, uint kend, uint hk, uint tid) {
    [[unroll]] for (uint i = 0u; i < PER; i++) {
        uint e = i * WGS + tid;
        uint j = min(kb + e / D4, kend - 1u);
        uint g = (j * pc.n_head_kv + hk) * D4 + e % D4;
        kpre[i] = PRE_LD(k4, g);
        vpre[i] = PRE_LD(v4, g);
    }
}

// The fetched block into shared memory, zeros past `kend`.
void store_block(uint kb, uint kend, uint tid) {
    [[unroll]] for (uint i = 0u; i < PER; i++) {
        uint e = i * WGS + tid;
        uint r = e / D4;
        uint c = e % D4;
        bool in_range = kb + r < kend;
        kv[r * LD + c] = f16vec4(in_range ? PRE_VAL(kpre[i]) : vec4(0.0));
        kv[BC * LD + r * LD + c] = f16vec4(in_range ? PRE_VAL(vpre[i]) : vec4(0.0));
    }
}

// The subgroup's scores of the block in shared memory: ss[sbase + row * SS + key] (unscaled).
void scores(MATA qa[FD], uint sbase) {
    [[unroll]] for (uint c = 0u; c < FC; c++) {
        ACC s = ACC(0.0);
        [[unroll]] for (uint i = 0u; i < FD; i++) {
            MATB kb;
            coopMatLoad(kb, kv, (16u * c) * LD + 4u * i, LD, gl_CooperativeMatrixLayoutColumnMajor);
            s = coopMatMulAdd(qa[i], kb, s);
        }
        coopMatStore(s, ss, sbase + 16u * c, SS, gl_CooperativeMatrixLayoutRowMajor);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint h = gl_WorkGroupID.y;
    uint hk = h / (pc.n_head / pc.n_head_kv);
    uint t0 = gl_WorkGroupID.x * BR;
    uint pos0 = pos[pc.pos_offset];

    // The workgroup's key range: from the first token's first key to the last token's last.
    uint t_last = min(t0 + BR, pc.n_tokens) - 1u;
    uint kend = min(pos0 + t_last + 1u, pc.n_kv_rows);
    uint p_first = pos0 + t0;
    uint kbeg = (pc.window > 0u && p_first + 1u > pc.window) ? p_first + 1u - pc.window : 0u;
    // this piece's share of the blocks
    uint piece = gl_WorkGroupID.z;
    uint blocks = kend > kbeg ? (kend - kbeg + BC - 1u) / BC : 0u;
    uint per = (blocks + pc.n_split - 1u) / pc.n_split;
    uint pend = min(kend, kbeg + (piece + 1u) * per * BC);
    kbeg += piece * per * BC;
    kend = pend;

    // q tile -> f16 in shared -> each subgroup's A fragments
    [[unroll]] for (uint e0 = 0u; e0 < BR * D4; e0 += WGS) {
        uint e = e0 + tid;
        uint r = e / D4;
        uint t = t0 + r;
        vec4 qx = t < pc.n_tokens ? q4[(t * pc.n_head + h) * D4 + e % D4] : vec4(0.0);
        kv[r * LD + e % D4] = f16vec4(qx);
    }
    barrier();
    MATA qa[FD];
    [[unroll]] for (uint i = 0u; i < FD; i++) {
        coopMatLoad(qa[i], kv, (16u * sg) * LD + 4u * i, LD, gl_CooperativeMatrixLayoutRowMajor);
    }
    barrier();

    // This lane's row (lanes r and r + 16 share row r, each half of a block's keys) and its
    // visible keys.
    uint row = lane % 16u;
    uint k0 = (lane / 16u) * HALF;
    uint t = t0 + 16u * sg + row;
    uint p = pos0 + t;
    uint first = (pc.window > 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    uint last = t < pc.n_tokens ? min(p + 1u, pc.n_kv_rows) : 0u; // exclusive
    uint sbase = sg * 16u * SS;
    uint srow = sbase + row * SS + k0;
    uint prow = sg * 16u * LDP + row * LDP + k0 / 4u;

    // One pass: per block, scores, then weights exp(s - m) against the row's reference maximum
    // m, then weights x V into the accumulators. m follows the true maximum lazily: only when a
    // block's maximum passes it by more than GROW does the subgroup rescale (l and its
    // accumulators, through the staging tile); otherwise weights up to 2^GROW are exact in f16
    // and l, the output and the merge all use the same m. Scores, m and the weights' exponents
    // are in log2 units (exp2 is the hardware's).
    float sl = pc.scale * LOG2E;
    float m = NEG_BIG;
    float l = 0.0;
    // keys [clear_from, clear_to) are visible to every row of the tile below n_tokens
    uint p_last = pos0 + t_last;
    uint clear_from = (pc.window > 0u && p_last + 1u > pc.window) ? p_last + 1u - pc.window : 0u;
    uint clear_to = min(pos0 + t0 + 1u, pc.n_kv_rows);
    bool started = false; // the accumulators hold something (uniform)
    ACC acc[FD];
    [[unroll]] for (uint i = 0u; i < FD; i++) {
        acc[i] = ACC(0.0);
    }
    if (kbeg < kend) {
        fetch_block(kbeg, kend, hk, tid);
    }
    for (uint kb = kbeg; kb < kend; kb += BC) {
        store_block(kb, kend, tid);
        barrier();
        if (kb + BC < kend) {
            fetch_block(kb + BC, kend, hk, tid);
        }
        scores(qa, sbase);
        // a block every real row of the tile sees whole needs no mask
        bool clear = kb >= clear_from && kb + BC <= clear_to;
        float sv[HALF];
        float bm = NEG_BIG;
        [[unroll]] for (uint i = 0u; i < HALF; i++) {
            uint j = kb + k0 + i;
            sv[i] = (clear || (j >= first && j < last)) ? sl * ss[srow + i] : NEG_BIG;
            bm = max(bm, sv[i]);
        }
        bm = max(bm, subgroupShuffleXor(bm, 16u));
        if (subgroupAny(bm > m + GROW)) {
            float mn = max(m, bm);
            float f = exp2(m - mn);
            l *= f;
            m = mn;
            if (started) {
                // every row of every accumulator times its factor (scores are in sv by now)
                subgroupBarrier();
                [[unroll]] for (uint i = 0u; i < FD; i++) {
                    coopMatStore(acc[i], ss, sbase, 16u, gl_CooperativeMatrixLayoutRowMajor);
                    subgroupMemoryBarrierShared();
                    subgroupBarrier();
                    [[unroll]] for (uint e0 = 0u; e0 < 256u; e0 += 32u) {
                        uint e = e0 + lane;
                        ss[sbase + e] *= subgroupShuffle(f, e / 16u);
                    }
                    subgroupMemoryBarrierShared();
                    subgroupBarrier();
                    coopMatLoad(acc[i], ss, sbase, 16u, gl_CooperativeMatrixLayoutRowMajor);
                    subgroupBarrier();
                }
            }
        }
        float bl = 0.0;
        [[unroll]] for (uint i = 0u; i < HALF; i += 4u) {
            vec4 w;
            [[unroll]] for (uint u = 0u; u < 4u; u++) {
                uint j = kb + k0 + i + u;
                w[u] = (clear || (j >= first && j < last)) ? exp2(sv[i + u] - m) : 0.0;
            }
            bl += (w.x + w.y) + (w.z + w.w);
            ps[prow + i / 4u] = f16vec4(w);
        }
        l += bl + subgroupShuffleXor(bl, 16u);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        [[unroll]] for (uint c = 0u; c < FC; c++) {
            MATA pa;
            coopMatLoad(pa, ps, sg * 16u * LDP + 4u * c, LDP, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint i = 0u; i < FD; i++) {
                MATB vb;
                coopMatLoad(vb, kv, BC * LD + (16u * c) * LD + 4u * i, LD,
                            gl_CooperativeMatrixLayoutRowMajor);
                acc[i] = coopMatMulAdd(pa, vb, acc[i]);
            }
        }
        started = true;
        barrier();
    }

    // out = acc / l (or the piece's acc, m and l), through a 16 x 16 staging tile per subgroup
    // (constant indices only: a variably indexed accumulator array would live in local memory).
    bool split = pc.n_split > 1u;
    uint n_rows = pc.n_tokens * pc.n_head;
    // the row's softmax denominator: l, plus the sink's column (no value) with sinks
    float den = l + (pc.has_sinks != 0u && !split ? exp2(sinks[h] * LOG2E - m) : 0.0);
    if (split && lane < 16u && t < pc.n_tokens) {
        uint mb = n_rows * pc.n_split * D + 2u * ((t * pc.n_head + h) * pc.n_split + piece);
        part[mb] = m / LOG2E; // the merge works in natural units
        part[mb + 1u] = l;
    }
    [[unroll]] for (uint i = 0u; i < FD; i++) {
        coopMatStore(acc[i], ss, sbase, 16u, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        [[unroll]] for (uint e0 = 0u; e0 < 256u; e0 += 32u) {
            uint e = e0 + lane;
            uint r = e / 16u;
            float lr = subgroupShuffle(den, r);
            uint tr = t0 + 16u * sg + r;
            if (tr < pc.n_tokens) {
                float x = ss[sbase + e];
                uint r = tr * pc.n_head + h;
                if (split) {
                    part[(r * pc.n_split + piece) * D + 16u * i + e % 16u] = x;
                } else {
                    o[r * D + 16u * i + e % 16u] = lr > 0.0 ? x / lr : 0.0;
                }
            }
        }
        subgroupBarrier();
    }
}
