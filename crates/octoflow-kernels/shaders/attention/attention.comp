#version 450
// Causal attention with grouped KV heads and an optional sliding window, f32 (the caches f32,
// or f16 in the `attention_kv16` variant: kv.glsl).
//   q [n_tokens, n_head, head_dim], k [n_kv_rows, n_head_kv, head_dim],
//   v [n_kv_rows, n_head_kv, head_dim_v], o [n_tokens, n_head, head_dim_v].
// Query t sits at p = pos[pos_offset] + t and sees keys j in [first, min(p, n_kv_rows - 1)],
// first = p + 1 - window when windowed (else 0). Table mode (several sequences in paged caches,
// page.glsl): query t sits at p = pos[pos_offset + 2t] and key j of its sequence is cache row
// PAGE_ROW(pos, pos[pos_offset + 2t + 1], j) (rows past kv_total are never read); one token per
// cluster. Query head h reads KV head h / (n_head / n_head_kv).
//
// A cluster of CL adjacent invocations owns HPL query heads of one KV head (GQA group) for TPL
// consecutive tokens: every K and V row it loads serves all HPL * TPL queries. Lane c of the
// cluster holds dims (r * CL + c) * 4 .. + 4 of each query and of each output accumulator in
// registers (constant-trip, unrolled loops); partial dot products are summed across the cluster
// with xor shuffles. Keys stream one by one with an online softmax (running max m, running sum
// l, accumulators rescaled when the max grows); memory does not depend on the context length.
//
// Split-K (flash decoding): the cluster's key range is cut into n_split pieces, one cluster
// each. With n_split == 1 the result goes to o; otherwise the unnormalized (m, l, acc) of each
// piece goes to the scratch buffer `part` and attention_merge.comp combines the pieces.
//
// Sinks (has_sinks, gpt-oss): query head h's softmax denominator also counts exp(sinks[h] - m),
// a column with no value (llama.cpp's soft_max with sinks), added where the output is
// normalized (here with one piece, else in the merge).
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_GOOGLE_include_directive : require
#include "kv.glsl"
#include "page.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint CL = 8;       // lanes per cluster, power of two <= subgroup
layout(constant_id = 2) const uint NK4 = 2;      // vec4s of a q/k row per lane
layout(constant_id = 3) const uint NV4 = 2;      // vec4s of a v row per lane
layout(constant_id = 4) const uint HPL = 3;      // query heads per cluster
layout(constant_id = 5) const uint TPL = 1;      // tokens per cluster
layout(constant_id = 6) const bool ALIGNED = true; // head_dim and head_dim_v multiples of 4

const uint NQ = HPL * TPL;
const float NEG_BIG = -1.0e30; // "nothing seen yet": finite, so exp(NEG_BIG - NEG_BIG) = 1

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { KV_T k[]; };
layout(std430, binding = 2) readonly buffer V { KV_T v[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(std430, binding = 4) readonly buffer P { uint pos[]; };
layout(std430, binding = 5) writeonly buffer Part { float part[]; };
layout(std430, binding = 6) readonly buffer S { float sinks[]; };
layout(std430, binding = 0) readonly buffer Q4 { vec4 q4[]; };
layout(std430, binding = 1) readonly buffer K4 { KV4_T k4[]; };
layout(std430, binding = 2) readonly buffer V4 { KV4_T v4[]; };
layout(std430, binding = 3) writeonly buffer O4 { vec4 o4[]; };
layout(std430, binding = 5) writeonly buffer Part4 { vec4 part4[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint head_dim_v;
    uint n_kv_rows;
    uint window;
    uint pos_offset;
    float scale;
    uint n_split;
    uint table;    // 1: per-token (position, block table offset) pairs in pos
    uint kv_total; // rows in the k and v buffers
    uint has_sinks;
} pc;

// 4 floats from element e of a row of width `width` (zeros past it).
vec4 ld_q(uint base, uint e) {
    if (ALIGNED) {
        return e < pc.head_dim ? q4[(base + e) >> 2] : vec4(0.0);
    }
    vec4 r = vec4(0.0);
    for (uint i = 0; i < 4u; i++) {
        if (e + i < pc.head_dim) r[i] = q[base + e + i];
    }
    return r;
}

vec4 ld_k(uint base, uint e) {
#ifdef KV_Q8
    return e < pc.head_dim ? q8_ld4(k4, base + e) : vec4(0.0);
#else
    if (ALIGNED) {
        return e < pc.head_dim ? vec4(k4[(base + e) >> 2]) : vec4(0.0);
    }
    vec4 r = vec4(0.0);
    for (uint i = 0; i < 4u; i++) {
        if (e + i < pc.head_dim) r[i] = float(k[base + e + i]);
    }
    return r;
#endif
}

vec4 ld_v(uint base, uint e) {
#ifdef KV_Q8
    return e < pc.head_dim_v ? q8_ld4(v4, base + e) : vec4(0.0);
#else
    if (ALIGNED) {
        return e < pc.head_dim_v ? vec4(v4[(base + e) >> 2]) : vec4(0.0);
    }
    vec4 r = vec4(0.0);
    for (uint i = 0; i < 4u; i++) {
        if (e + i < pc.head_dim_v) r[i] = float(v[base + e + i]);
    }
    return r;
#endif
}

void main() {
    uint clusters = gl_WorkGroupSize.x / CL;
    uint ci = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * clusters
        + gl_LocalInvocationID.x / CL;
    uint lane = gl_LocalInvocationID.x % CL;
    uint group = pc.n_head / pc.n_head_kv;
    uint n_hc = (group + HPL - 1u) / HPL;
    uint n_tb = (pc.n_tokens + TPL - 1u) / TPL;
    uint tb = ci % n_tb;
    uint rest = ci / n_tb;
    uint hc = rest % n_hc;
    rest /= n_hc;
    uint kvh = rest % pc.n_head_kv;
    uint split = rest / pc.n_head_kv;
    // clusters past the grid idle along (no keys, no writes): the shuffles below run in
    // subgroup-uniform control flow, which some drivers need even for cluster-local exchanges
    bool idle = split >= pc.n_split;
    uint t0 = tb * TPL;
    uint h0 = kvh * group + hc * HPL;
    uint n_t = min(TPL, pc.n_tokens - t0);
    uint n_h = min(HPL, group - hc * HPL);

    // key range of the cluster: the union over its tokens, then this split's piece of it
    uint p0 = pos[pc.pos_offset] + t0;
    uint bt = 0u; // table mode: where the sequence's block table starts in pos
    if (pc.table != 0u) {
        p0 = pos[pc.pos_offset + 2u * t0];
        bt = pos[pc.pos_offset + 2u * t0 + 1u];
    }
    uint first0 = (pc.window != 0u && p0 + 1u > pc.window) ? p0 + 1u - pc.window : 0u;
    uint end_all = min(p0 + n_t, pc.n_kv_rows); // exclusive
    if (pc.table == 0u) {
        end_all = min(end_all, pc.kv_total);
    }
    uint len = end_all > first0 ? end_all - first0 : 0u;
    uint chunk = max((len + pc.n_split - 1u) / pc.n_split, 16u);
    uint js = min(first0 + split * chunk, max(end_all, first0));
    uint je = idle ? js : min(js + chunk, max(end_all, first0));
    uint n_keys = je - js;
    uint n_steps = subgroupMax(n_keys); // the same trip count across the subgroup

    vec4 qv[NQ][NK4];
    for (uint i = 0; i < TPL; i++) {
        for (uint u = 0; u < HPL; u++) {
            uint qb = ((t0 + min(i, n_t - 1u)) * pc.n_head + h0 + min(u, n_h - 1u)) * pc.head_dim;
            for (uint r = 0; r < NK4; r++) {
                qv[i * HPL + u][r] = pc.scale * ld_q(qb, (r * CL + lane) * 4u);
            }
        }
    }
    float m[NQ];
    float l[NQ];
    vec4 acc[NQ][NV4];
    for (uint x = 0; x < NQ; x++) {
        m[x] = NEG_BIG;
        l[x] = 0.0;
        for (uint r = 0; r < NV4; r++) {
            acc[x][r] = vec4(0.0);
        }
    }

    uint k_stride = pc.n_head_kv * pc.head_dim;
    uint v_stride = pc.n_head_kv * pc.head_dim_v;
    for (uint n = 0; n < n_steps; n++) {
        uint j = js + n;
        uint row = pc.table != 0u ? PAGE_ROW(pos, bt, j, pc.kv_total) : j;
        bool live = n < n_keys && row < pc.kv_total;
        uint kb = row * k_stride + kvh * pc.head_dim;
        vec4 kr[NK4];
        for (uint r = 0; r < NK4; r++) {
            kr[r] = vec4(0.0);
            if (live) kr[r] = ld_k(kb, (r * CL + lane) * 4u);
        }
        float s[NQ];
        for (uint x = 0; x < NQ; x++) {
            float d = 0.0;
            for (uint r = 0; r < NK4; r++) {
                d += dot(qv[x][r], kr[r]);
            }
            s[x] = d;
        }
        for (uint off = CL / 2u; off > 0u; off >>= 1) {
            for (uint x = 0; x < NQ; x++) {
                s[x] += subgroupShuffleXor(s[x], off);
            }
        }
        uint vb = row * v_stride + kvh * pc.head_dim_v;
        vec4 vr[NV4];
        for (uint r = 0; r < NV4; r++) {
            vr[r] = vec4(0.0);
            if (live) vr[r] = ld_v(vb, (r * CL + lane) * 4u);
        }
        for (uint i = 0; i < TPL; i++) {
            // token t0 + i sees keys [first0 + i (windowed), p0 + i]
            bool seen = live && j <= p0 + i && (pc.window == 0u || j + pc.window > p0 + i);
            for (uint u = 0; u < HPL; u++) {
                uint x = i * HPL + u;
                float sx = seen ? s[x] : NEG_BIG;
                float mn = max(m[x], sx);
                float alpha = exp(m[x] - mn);
                float pj = seen ? exp(sx - mn) : 0.0;
                l[x] = l[x] * alpha + pj;
                m[x] = mn;
                for (uint r = 0; r < NV4; r++) {
                    acc[x][r] = acc[x][r] * alpha + pj * vr[r];
                }
            }
        }
    }

    for (uint i = 0; i < TPL; i++) {
        for (uint u = 0; u < HPL; u++) {
            uint x = i * HPL + u;
            if (idle || i >= n_t || u >= n_h) {
                continue;
            }
            uint row = (t0 + i) * pc.n_head + h0 + u; // query index
            uint ob;
            float f = 1.0;
            if (pc.n_split == 1u) {
                ob = row * pc.head_dim_v;
                float den = l[x] + (pc.has_sinks != 0u ? exp(sinks[h0 + u] - m[x]) : 0.0);
                f = den > 0.0 ? 1.0 / den : 0.0; // 0: no key, or a sink beyond exp's range
            } else {
                // part: [rows * n_split, head_dim_v] acc, then [rows * n_split] (m, l) pairs
                uint slot = row * pc.n_split + split;
                ob = slot * pc.head_dim_v;
                if (lane == 0u) {
                    uint mb = pc.n_tokens * pc.n_head * pc.n_split * pc.head_dim_v + 2u * slot;
                    part[mb] = m[x];
                    part[mb + 1u] = l[x];
                }
            }
            for (uint r = 0; r < NV4; r++) {
                uint e = (r * CL + lane) * 4u;
                vec4 val = acc[x][r] * f;
                if (ALIGNED) {
                    if (e < pc.head_dim_v) {
                        if (pc.n_split == 1u) {
                            o4[(ob + e) >> 2] = val;
                        } else {
                            part4[(ob + e) >> 2] = val;
                        }
                    }
                } else {
                    for (uint c = 0; c < 4u; c++) {
                        if (e + c < pc.head_dim_v) {
                            if (pc.n_split == 1u) {
                                o[ob + e + c] = val[c];
                            } else {
                                part[ob + e + c] = val[c];
                            }
                        }
                    }
                }
            }
        }
    }
}
