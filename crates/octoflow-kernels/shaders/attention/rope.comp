#version 450
// Rotary position embedding, f32, in place on x [n_tokens, n_heads, head_dim]. One invocation
// per rotated pair: pair i < n_rot/2 of head (t, h) is (2i, 2i+1) (normal) or (i, i + n_rot/2)
// (neox), rotated by theta_i = p * f[i] and scaled by mscale (by -theta_i when `inverse`: the
// transpose, RoPE's backward) with p = pos[pos_offset] + t (table mode: pos[pos_offset + 2t]).
// f is the host's per-pair frequency table (double-float radians per position, see rope.glsl).
// Dims >= n_rot are not touched.
//
// Accuracy: see rope.glsl (double-float angle, reduced to a fraction of a turn).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"
#include "rope.glsl"

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer P { uint pos[]; };
layout(std430, binding = 2) readonly buffer F { vec2 freq[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_heads;
    uint head_dim;
    uint n_rot;
    uint neox;
    uint pos_offset;
    float mscale;
    uint table; // 1: token t at pos[pos_offset + 2t] (per-token (position, row) pairs)
    uint inverse; // 1: rotate by -theta (the transpose: RoPE's backward)
} pc;

void main() {
    uint half_rot = pc.n_rot / 2u;
    uint idx = global_index();
    if (idx >= pc.n_tokens * pc.n_heads * half_rot) {
        return;
    }
    uint i = idx % half_rot;
    uint head = idx / half_rot; // t * n_heads + h
    uint t = head / pc.n_heads;
    uint p = pc.table != 0u ? pos[pc.pos_offset + 2u * t] : pos[pc.pos_offset] + t;

    vec2 cossin = rope_cos_sin(freq[i], p, pc.mscale);
    float cs = cossin.x;
    float sn = pc.inverse != 0u ? -cossin.y : cossin.y;

    uint base = head * pc.head_dim;
    uint a = pc.neox != 0u ? base + i : base + 2u * i;
    uint bi = pc.neox != 0u ? a + half_rot : a + 1u;
    float x0 = x[a];
    float x1 = x[bi];
    x[a] = x0 * cs - x1 * sn;
    x[bi] = x0 * sn + x1 * cs;
}
