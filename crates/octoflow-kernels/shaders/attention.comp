#version 450
// Causal attention with grouped KV heads and an optional sliding window, f32.
//   q [n_tokens, n_head, head_dim], k [n_kv_rows, n_head_kv, head_dim],
//   v [n_kv_rows, n_head_kv, head_dim_v], o [n_tokens, n_head, head_dim_v].
// Query t sits at p = pos[pos_offset] + t and sees keys j in [first, min(p, n_kv_rows - 1)],
// first = p + 1 - window when windowed (else 0). Query head h reads KV head h / (n_head / n_head_kv).
//
// One workgroup per (head, token). Keys stream in chunks of CHUNK (one key per invocation for
// the score), with an online softmax: running max m, running sum l, and the output accumulator
// rescaled by exp(m_old - m_new) when the max grows. Memory does not depend on the context.
// Invocation d (and d + CHUNK) owns output dims d of the accumulator, reading V rows coalesced.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#define CHUNK 128
#define MAX_D 256
#define D_PER (MAX_D / CHUNK)

layout(local_size_x = CHUNK) in;

#include "reduce.glsl"

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(std430, binding = 4) readonly buffer P { uint pos[]; };

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
} pc;

shared float qs[MAX_D];
shared float ps[CHUNK];

void main() {
    uint h = gl_WorkGroupID.x;
    uint t = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint kvh = h / (pc.n_head / pc.n_head_kv);
    uint p = pos[pc.pos_offset] + t;
    uint first = (pc.window != 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    uint end = min(p + 1u, pc.n_kv_rows); // exclusive

    uint qb = (t * pc.n_head + h) * pc.head_dim;
    for (uint d = tid; d < pc.head_dim; d += CHUNK) {
        qs[d] = q[qb + d];
    }
    barrier();

    uint k_stride = pc.n_head_kv * pc.head_dim;
    uint v_stride = pc.n_head_kv * pc.head_dim_v;
    uint k_head = kvh * pc.head_dim;
    uint v_head = kvh * pc.head_dim_v;
    float m = uintBitsToFloat(0xff800000u); // -inf: nothing seen yet
    float l = 0.0;
    float acc[D_PER];
    for (uint r = 0; r < D_PER; r++) {
        acc[r] = 0.0;
    }

    for (uint j0 = first; j0 < end; j0 += CHUNK) {
        uint j = j0 + tid;
        float s = uintBitsToFloat(0xff800000u);
        if (j < end) {
            uint kb = j * k_stride + k_head;
            float dot_qk = 0.0;
            for (uint d = 0; d < pc.head_dim; d++) {
                dot_qk += qs[d] * k[kb + d];
            }
            s = pc.scale * dot_qk;
        }
        // key j0 is visible, so the chunk max is finite
        float m_new = max(m, wg_max(s));
        float pj = j < end ? exp(s - m_new) : 0.0;
        float alpha = l > 0.0 ? exp(m - m_new) : 0.0;
        ps[tid] = pj;
        l = l * alpha + wg_sum(pj); // its barrier also publishes ps
        m = m_new;
        uint count = min(uint(CHUNK), end - j0);
        for (uint r = 0; r < D_PER; r++) {
            uint d = tid + r * CHUNK;
            if (d < pc.head_dim_v) {
                float a = acc[r] * alpha;
                uint vb = j0 * v_stride + v_head + d;
                for (uint c = 0; c < count; c++) {
                    a += ps[c] * v[vb + c * v_stride];
                }
                acc[r] = a;
            }
        }
        barrier(); // ps is rewritten by the next chunk
    }

    float inv = l > 0.0 ? 1.0 / l : 0.0;
    uint ob = (t * pc.n_head + h) * pc.head_dim_v;
    for (uint r = 0; r < D_PER; r++) {
        uint d = tid + r * CHUNK;
        if (d < pc.head_dim_v) {
            o[ob + d] = acc[r] * inv;
        }
    }
}
