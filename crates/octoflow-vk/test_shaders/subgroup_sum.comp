#version 450
// Test kernel: per-workgroup sums of x with subgroup arithmetic. Workgroup g writes
// partial[g] = sum of x[g*W .. g*W+W) (W = workgroup size, a spec constant), zero past n.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x_id = 0) in;

layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer P { float partial[]; };

layout(push_constant) uniform Push { uint n; } pc;

// One slot per subgroup; 64 covers a 1024-wide workgroup of 16-wide subgroups and beyond.
shared float sums[64];

void main() {
    uint i = gl_GlobalInvocationID.x;
    float v = i < pc.n ? x[i] : 0.0;
    float s = subgroupAdd(v);
    if (subgroupElect()) {
        sums[gl_SubgroupID] = s;
    }
    barrier();
    if (gl_LocalInvocationID.x == 0) {
        float total = 0.0;
        for (uint k = 0; k < gl_NumSubgroups; k++) {
            total += sums[k];
        }
        partial[gl_WorkGroupID.x] = total;
    }
}
