#version 450
// Test kernel: y[i] = x[i] + ctrl[slot] for i < n. The added value comes from a control buffer
// the host rewrites between submits, as decode chains read position and token.

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(std430, binding = 2) readonly buffer Ctrl { float ctrl[]; };

layout(push_constant) uniform Push { uint n; uint slot; } pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < pc.n) {
        y[i] = x[i] + ctrl[pc.slot];
    }
}
