#version 450
// A mixture of experts' front for a few tokens in one dispatch: the block's RMSNorm, the router
// product and the top-k routing that moe_route.comp does, without a barrier phase between them.
// For each token t of [TT * y, TT * y + TT) (workgroup y) and rows [ROWS * x, ROWS * x + ROWS)
// of the router (workgroup x):
//   h[t]          = x[t] * inv * g,  inv = 1 / sqrt(mean(x[t]^2) + eps)   (written by x = 0)
//   logits[t, r]  = inv * dot(W row r, x[t] * g) (+ bias[r])
// then the last of the token's workgroups to finish runs moe_topk.glsl's selection and gating
// over the token's logits into ids and wt. Every workgroup writes its logits, makes them visible
// device-wide (memoryBarrierBuffer, barrier) and bumps each of its tokens' counters in `cnt`
// (zero-initialized, per queue); the one that sees n_wg - 1 for a token reads its logits
// (coherent), puts the counter back to 0 for the next replay and routes it. No workgroup waits
// for another.
// W: n_expert rows of row_bytes bytes of the GGUF type (quant.glsl). The reference is
// `moe_router_ref` (moe/router.rs): rms_norm_ref, linear_ref and moe_route_ref in a row.
// With flags bit 1 (n_cols a multiple of 32), workgroup 0 also writes h quantized per block of
// 32 as quantize_q8.comp lays it out (codes, then per block (d, d * sum of codes), then 1 per
// token) from the same values it writes to h: the experts' 8-bit dot products copy it instead
// of quantizing h in each of their workgroups.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#define QWINDOW 1 // unrolled chunk fetch and decode (quant.glsl)

#define WG 256u
#define TOPK_WG WG

layout(local_size_x = 256) in;
// Router rows and tokens a workgroup takes: (2, 1) for a few tokens (more workgroups, each
// short), (8, 8) for many (each router row read once for 8 tokens, each x row once for 8 rows:
// a batch's router traffic ~8x less).
layout(constant_id = 0) const uint ROWS = 2u;
layout(constant_id = 1) const uint TT = 1u;
const uint TPR = WG / ROWS;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer G { float g[]; };
layout(std430, binding = 2) readonly buffer G4 { vec4 g4[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
layout(std430, binding = 4) writeonly buffer H { float h[]; };
layout(std430, binding = 5) coherent buffer L { float logits[]; };
layout(std430, binding = 6) writeonly buffer Ids { uint ids[]; };
layout(std430, binding = 7) writeonly buffer Wt { float wt[]; };
layout(std430, binding = 8) coherent buffer Cnt { uint cnt[]; };
layout(std430, binding = 4) writeonly buffer H4 { vec4 h4[]; };
layout(std430, binding = 9) writeonly buffer XQ { uint xq[]; };
layout(std430, binding = 9) writeonly buffer XF { float xf[]; };

layout(push_constant) uniform Push {
    uint n_expert;
    uint n_cols;
    uint row_bytes;
    uint n_used;
    uint gating;
    float scale;
    float eps;
    uint flags; // bit 0: add the bias, bit 1: write q8(h) too
    uint n_tokens;
} pc;

#include "quant.glsl"
#include "moe_topk.glsl"
#include "q8.glsl"

shared float red[TT * WG];
shared uint last; // bit j: this workgroup is the last of token t0 + j's to finish

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint t0 = gl_WorkGroupID.y * TT;
    uint nt = min(TT, pc.n_tokens - t0);
    bool xvec = (pc.n_cols & 3u) == 0u;

    // 1. the norm's scale of each token (each workgroup its own; x is small and in cache): the
    // tokens' loads in one pass, their sums in one reduction (wg_sum's order, per token)
    float ss[TT];
    for (uint j = 0u; j < TT; j++) {
        ss[j] = 0.0;
    }
    if (xvec) {
        for (uint i = tid; i < pc.n_cols / 4u; i += WG) {
            for (uint j = 0u; j < TT; j++) {
                if (j < nt) {
                    vec4 v = x4[(((t0 + j) * pc.n_cols) >> 2) + i];
                    ss[j] += dot(v, v);
                }
            }
        }
    } else {
        for (uint i = tid; i < pc.n_cols; i += WG) {
            for (uint j = 0u; j < TT; j++) {
                if (j < nt) {
                    float v = x[(t0 + j) * pc.n_cols + i];
                    ss[j] += v * v;
                }
            }
        }
    }
    for (uint j = 0u; j < TT; j++) {
        float a = subgroupAdd(ss[j]);
        if (subgroupElect()) {
            red[j * WG + gl_SubgroupID] = a;
        }
    }
    barrier();
    float inv[TT];
    for (uint j = 0u; j < TT; j++) {
        float tot = 0.0;
        for (uint i = 0u; i < gl_NumSubgroups; i++) {
            tot += red[j * WG + i];
        }
        inv[j] = 1.0 / sqrt(tot / float(pc.n_cols) + pc.eps);
    }
    barrier(); // red is the rows' reduction below
    if (gl_WorkGroupID.x == 0u && (pc.flags & 2u) != 0u) {
        // a block of 32 an invocation: h and its q8 codes from the same values
        uint nb = pc.n_cols / 32u;
        uint xrow = pc.n_cols / 4u;
        uint sbase = pc.n_tokens * xrow;
        for (uint j = 0u; j < nt; j++) {
            uint t = t0 + j;
            for (uint b = tid; b < nb; b += WG) {
                vec4 v[8];
                [[unroll]] for (uint k = 0u; k < 8u; k++) {
                    uint q = t * xrow + 8u * b + k;
                    v[k] = x4[q] * inv[j] * g4[8u * b + k];
                    h4[q] = v[k];
                }
                vec2 s = q8_store(v, t * xrow + 8u * b);
                uint si = sbase + 2u * (t * nb + b);
                xf[si] = s.x;
                xf[si + 1u] = s.y;
            }
            if (tid == 0u) {
                xf[sbase + 2u * pc.n_tokens * nb + t] = 1.0;
            }
        }
    } else if (gl_WorkGroupID.x == 0u) {
        for (uint j = 0u; j < nt; j++) {
            uint xb = (t0 + j) * pc.n_cols;
            for (uint i = tid; i < pc.n_cols; i += WG) {
                h[xb + i] = x[xb + i] * inv[j] * g[i];
            }
        }
    }

    // 2. this workgroup's rows of the router, on x * g (inv applied to the sum), for each of
    // its tokens: a weight chunk decoded once for all of them
    uint lr = tid / TPR;
    uint lane = tid % TPR;
    uint r = gl_WorkGroupID.x * ROWS + lr;
    float acc[TT];
    for (uint j = 0u; j < TT; j++) {
        acc[j] = 0.0;
    }
    if (r < pc.n_expert) {
        uint rb = r * pc.row_bytes;
        uint nc = chunk_count(pc.n_cols);
        for (uint c = lane; c < nc; c += TPR) {
            uint len = chunk_len(c, pc.n_cols);
            float v[32];
            dequant_chunk(rb, c, pc.n_cols, v);
            for (uint j = 0u; j < TT; j++) {
                if (j < nt) {
                    uint xb = (t0 + j) * pc.n_cols;
                    if (len == 32u && xvec) {
                        [[unroll]] for (uint i = 0u; i < 8u; i++) {
                            uint q = ((xb + 32u * c) >> 2) + i;
                            vec4 xv = x4[q] * g4[8u * c + i];
                            acc[j] += dot(vec4(v[4u * i], v[4u * i + 1u], v[4u * i + 2u], v[4u * i + 3u]), xv);
                        }
                    } else {
                        for (uint i = 0u; i < len; i++) {
                            uint k = 32u * c + i;
                            acc[j] += v[i] * (x[xb + k] * g[k]);
                        }
                    }
                }
            }
        }
    }
    // each row's sums: its subgroups' sums (a subgroup never straddles two rows: sizes divide
    // TPR), then lane 0 of the row adds them
    for (uint j = 0u; j < TT; j++) {
        float a = subgroupAdd(acc[j]);
        if (subgroupElect()) {
            red[j * WG + gl_SubgroupID] = a;
        }
    }
    barrier();
    if (lane == 0u && r < pc.n_expert) {
        uint per = TPR / gl_SubgroupSize;
        for (uint j = 0u; j < nt; j++) {
            float sum = 0.0;
            for (uint i = 0u; i < per; i++) {
                sum += red[j * WG + lr * per + i];
            }
            float o = sum * inv[j];
            if ((pc.flags & 1u) != 0u) {
                o += bias[r];
            }
            logits[(t0 + j) * pc.n_expert + r] = o;
        }
    }

    // 3. the last workgroup of each token routes it
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) {
        uint m = 0u;
        for (uint j = 0u; j < nt; j++) {
            if (atomicAdd(cnt[t0 + j], 1u) == gl_NumWorkGroups.x - 1u) {
                m |= 1u << j;
            }
        }
        last = m;
    }
    barrier();
    uint lastm = last;
    if (lastm == 0u) {
        return; // whole workgroup
    }
    memoryBarrierBuffer();
    for (uint j = 0u; j < nt; j++) {
        if ((lastm & (1u << j)) == 0u) {
            continue;
        }
        uint t = t0 + j;
        if (tid == 0u) {
            atomicExchange(cnt[t], 0u); // every workgroup has counted: ready for the next replay
        }
        for (uint e = tid; e < pc.n_expert; e += WG) {
            lg[e] = logits[t * pc.n_expert + e];
        }
        barrier();
        route_token(t, pc.n_expert, pc.n_used, pc.gating, pc.scale);
        barrier();
    }
}
