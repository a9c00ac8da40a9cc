#version 450
// RoPE of q and k plus the KV-cache write, f32 (the caches f32, or f16 / q8_0 in the
// `rope_store_kv16` / `rope_store_kvq8` variants: kv.glsl), in one dispatch (the decode step's
// rope(q), rope(k), barrier, set_rows(k), set_rows(v)):
//   q  [n_tokens, n_head, head_dim]       rotated in place;
//   k  [n_tokens, n_head_kv, head_dim]    read only: its rotated row goes to kc, k is unchanged;
//   v  [n_tokens, v_width]                read only, copied to vc;
//   kc [n_ctx, n_head_kv * head_dim], vc [n_ctx, v_width]: row `row(t)` of each is written.
// Token t is at position p(t) = pos[pos_offset] + t, cache row row(t) = p(t) (run mode), or
// p(t) = pos[pos_offset + 2t], row(t) = PAGE_ROW(pos, pos[pos_offset + 2t + 1], p(t)) (table
// mode: the second word is where the block table of t's sequence starts, page.glsl). Rows at or
// past n_ctx (the cache's rows) are not written (q is still rotated). Rotation as in rope.comp: pair i < n_rot/2 of a head is (2i, 2i+1) (normal) or
// (i, i + n_rot/2) (neox), rotated by theta_i = p * f[i] and scaled by mscale, f the host's
// per-pair frequency table (see rope.glsl); dims >= n_rot pass through (to kc for k). q, k, v,
// kc, vc must not overlap.
//
// One invocation per work item, the three ranges one after the other in the flat index:
//   [0, nq)           q pairs:   (t, h, i), nq = n_tokens * n_head * n_rot/2;
//   [nq, nq + nk)     k items:   (t, h, j), j < n_rot/2 a rotated pair, else pass-through dim
//                                n_rot + j - n_rot/2; nk = n_tokens * n_head_kv * (head_dim - n_rot/2);
//   [nq + nk, + nv)   v values:  nv = n_tokens * v_width.
// q8_0 caches (KV_Q8): the k and v ranges count whole blocks of 32 dims instead (a head's or a
// v row's blocks), each quantized by one invocation: nk = n_tokens * n_head_kv * head_dim / 32,
// nv = n_tokens * v_width / 32.
#extension GL_GOOGLE_include_directive : require
#include "kv.glsl"
#include "page.glsl"

layout(local_size_x = 256) in;

#include "common.glsl"
#include "rope.glsl"

layout(std430, binding = 0) buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) writeonly buffer KC { KV_T kc[]; };
layout(std430, binding = 4) writeonly buffer VC { KV_T vc[]; };
layout(std430, binding = 5) readonly buffer P { uint pos[]; };
layout(std430, binding = 6) readonly buffer F { vec2 freq[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint n_rot;
    uint v_width;
    uint n_ctx;
    uint neox;
    uint pos_offset;
    float mscale;
    uint table; // 1: per-token (position, block table offset) pairs from pos[pos_offset]
} pc;

uint position(uint t) {
    return pc.table != 0u ? pos[pc.pos_offset + 2u * t] : pos[pc.pos_offset] + t;
}

// The cache row of token t, or n_ctx when it lands at or past the end (never wraps around).
uint cache_row(uint t) {
    if (pc.table != 0u) {
        return PAGE_ROW(pos, pos[pc.pos_offset + 2u * t + 1u], pos[pc.pos_offset + 2u * t], pc.n_ctx);
    }
    uint first = pos[pc.pos_offset];
    return (first < pc.n_ctx && t < pc.n_ctx - first) ? first + t : pc.n_ctx;
}

vec2 cos_sin(uint i, uint t) {
    return rope_cos_sin(freq[i], position(t), pc.mscale);
}

// Offsets of pair i's two dims within a head.
uvec2 pair(uint i) {
    uint half_rot = pc.n_rot / 2u;
    return pc.neox != 0u ? uvec2(i, i + half_rot) : uvec2(2u * i, 2u * i + 1u);
}

#ifdef KV_Q8
// dim d of the rotated key head starting at k[src] of token t
float rotated_k(uint src, uint t, uint d) {
    if (d >= pc.n_rot) {
        return k[src + d];
    }
    uint i = pc.neox != 0u ? d % (pc.n_rot / 2u) : d / 2u;
    uvec2 ab = pair(i);
    vec2 cs = cos_sin(i, t);
    float x0 = k[src + ab.x];
    float x1 = k[src + ab.y];
    return d == ab.x ? x0 * cs.x - x1 * cs.y : x0 * cs.y + x1 * cs.x;
}
#endif

void main() {
    uint half_rot = pc.n_rot / 2u;
    uint idx = global_index();

    uint nq = pc.n_tokens * pc.n_head * half_rot;
    if (idx < nq) {
        uint i = idx % half_rot;
        uint head = idx / half_rot; // t * n_head + h
        uint t = head / pc.n_head;
        vec2 cs = cos_sin(i, t);
        uvec2 ab = pair(i) + head * pc.head_dim;
        float x0 = q[ab.x];
        float x1 = q[ab.y];
        q[ab.x] = x0 * cs.x - x1 * cs.y;
        q[ab.y] = x0 * cs.y + x1 * cs.x;
        return;
    }
    idx -= nq;

#ifdef KV_Q8
    // k blocks (t, h, b): 32 dims of a head, rotated and quantized together
    uint kblocks = pc.head_dim / 32u;
    uint nk = pc.n_tokens * pc.n_head_kv * kblocks;
    if (idx < nk) {
        uint b = idx % kblocks;
        uint head = idx / kblocks; // t * n_head_kv + h
        uint t = head / pc.n_head_kv;
        uint row = cache_row(t);
        if (row >= pc.n_ctx) {
            return;
        }
        vec4 xs[8];
        [[unroll]] for (uint i = 0u; i < 32u; i++) {
            xs[i / 4u][i % 4u] = rotated_k(head * pc.head_dim, t, b * 32u + i);
        }
        uint w[8];
        float d16 = q8_quantize(xs, w);
        q8_store_block(kc, (row * pc.n_head_kv + (head - t * pc.n_head_kv)) * kblocks + b, d16, w);
        return;
    }
    idx -= nk;

    // v blocks (t, b)
    uint vblocks = pc.v_width / 32u;
    if (idx < pc.n_tokens * vblocks) {
        uint t = idx / vblocks;
        uint b = idx - t * vblocks;
        uint row = cache_row(t);
        if (row < pc.n_ctx) {
            vec4 xs[8];
            [[unroll]] for (uint i = 0u; i < 32u; i++) {
                xs[i / 4u][i % 4u] = v[t * pc.v_width + b * 32u + i];
            }
            uint w[8];
            float d16 = q8_quantize(xs, w);
            q8_store_block(vc, row * vblocks + b, d16, w);
        }
    }
#else
    uint per_head = pc.head_dim - half_rot;
    uint nk = pc.n_tokens * pc.n_head_kv * per_head;
    if (idx < nk) {
        uint j = idx % per_head;
        uint head = idx / per_head; // t * n_head_kv + h
        uint t = head / pc.n_head_kv;
        uint row = cache_row(t);
        if (row >= pc.n_ctx) {
            return;
        }
        uint src = head * pc.head_dim;
        // row t of kc starts at row * n_head_kv * head_dim, head h at + h * head_dim
        uint dst = (row * pc.n_head_kv + (head - t * pc.n_head_kv)) * pc.head_dim;
        if (j < half_rot) {
            vec2 cs = cos_sin(j, t);
            uvec2 ab = pair(j);
            float x0 = k[src + ab.x];
            float x1 = k[src + ab.y];
            kc[dst + ab.x] = kv_store(x0 * cs.x - x1 * cs.y);
            kc[dst + ab.y] = kv_store(x0 * cs.y + x1 * cs.x);
        } else {
            uint d = pc.n_rot + (j - half_rot);
            kc[dst + d] = kv_store(k[src + d]);
        }
        return;
    }
    idx -= nk;

    if (idx < pc.n_tokens * pc.v_width) {
        uint t = idx / pc.v_width;
        uint row = cache_row(t);
        if (row < pc.n_ctx) {
            vc[row * pc.v_width + (idx - t * pc.v_width)] = kv_store(v[idx]);
        }
    }
#endif
}
