#version 450
// Dropout, f32: out[i] = keep(i) ? x[i] * scale : 0 for i < n, with scale = 1 / (1 - p) rounded
// to f32 on the host and keep(i) = uniform(seed, salt, i) >= p. The seed is read from a buffer
// (seed[seed_offset]) so the host can change it between runs of a recorded chain.
//
// uniform(seed, salt, i) (octoflow_kernels::dropout_uniform is the same function on the CPU):
//   key = mix(seed ^ mix(salt + 0x9E3779B9))
//   h   = mix(mix(i + key) ^ key)
//   u   = (h >> 8) * 2^-24                                   (24 random bits, exact in f32)
// where mix is the lowbias32 integer finalizer (x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15;
// x *= 0x846ca68b; x ^= x >> 16), a bijection of u32 with good avalanche.
// One invocation per element; `out` may be `x` (in place).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Out { float out_buf[]; };
layout(std430, binding = 2) readonly buffer Seed { uint seed[]; };

layout(push_constant) uniform Push {
    uint n;
    float p;
    float scale;
    uint salt;
    uint seed_offset;
} pc;

uint mix32(uint v) {
    v ^= v >> 16;
    v *= 0x7feb352du;
    v ^= v >> 15;
    v *= 0x846ca68bu;
    v ^= v >> 16;
    return v;
}

void main() {
    uint i = global_index();
    if (i >= pc.n) {
        return;
    }
    uint key = mix32(seed[pc.seed_offset] ^ mix32(pc.salt + 0x9E3779B9u));
    uint h = mix32(mix32(i + key) ^ key);
    float u = float(h >> 8) * (1.0 / 16777216.0);
    out_buf[i] = u >= pc.p ? x[i] * pc.scale : 0.0;
}
