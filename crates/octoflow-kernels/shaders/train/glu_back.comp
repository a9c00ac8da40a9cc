#version 450
// Gated linear unit backward, f32. Forward: h[i] = act(gate[i]) * up[i], act = SiLU (op 0) or the
// tanh approximation of GELU (op 1). Given dh: dgate[i] = dh[i] * act'(gate[i]) * up[i] and
// dup[i] = dh[i] * act(gate[i]) for i < n. dgate may be the same memory as gate and dup as up
// (each invocation reads its element of every input before writing).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer G { float gate[]; };
layout(std430, binding = 1) readonly buffer U { float up[]; };
layout(std430, binding = 2) readonly buffer DH { float dh[]; };
layout(std430, binding = 3) writeonly buffer DG { float dgate[]; };
layout(std430, binding = 4) writeonly buffer DU { float dup[]; };

layout(push_constant) uniform Push { uint n; uint op; } pc;

void main() {
    uint i = global_index();
    if (i >= pc.n) {
        return;
    }
    float g = gate[i];
    float u = up[i];
    float d = dh[i];
    float a;
    float da;
    if (pc.op == 0u) {
        // silu(g) = g s, s = sigmoid(g); silu'(g) = s (1 + g (1 - s))
        float s = 1.0 / (1.0 + exp(-g));
        a = g * s;
        da = s * (1.0 + g * (1.0 - s));
    } else {
        // gelu(g) = 0.5 g (1 + tanh(t)) = g s with s = sigmoid(2t), t = c (g + 0.044715 g^3);
        // gelu'(g) = s + g * 2 s (1 - s) * c (1 + 3 * 0.044715 g^2)   (1 - tanh^2 = 4 s (1 - s))
        float t = 0.7978846 * (g + 0.044715 * g * g * g);
        float s = 1.0 / (1.0 + exp(-2.0 * t));
        a = g * s;
        da = s + 2.0 * g * s * (1.0 - s) * 0.7978846 * (1.0 + 0.134145 * g * g);
    }
    dgate[i] = d * da * u;
    dup[i] = d * a;
}
