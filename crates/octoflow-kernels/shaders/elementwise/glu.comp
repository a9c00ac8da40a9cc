#version 450
// Gated linear unit, f32: o[i] = act(gate[i]) * up[i] for i < n; act = SiLU (op 0) or the
// tanh approximation of GELU (op 1) (glu.glsl). o may be the same memory as gate or up.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"
#include "glu.glsl"

layout(std430, binding = 0) readonly buffer G { float gate[]; };
layout(std430, binding = 1) readonly buffer U { float up[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };

layout(push_constant) uniform Push { uint n; uint op; } pc;

void main() {
    uint i = global_index();
    if (i >= pc.n) {
        return;
    }
    o[i] = glu_act(gate[i], pc.op) * up[i];
}
