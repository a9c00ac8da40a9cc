#version 450
// Mixture-of-experts routing, one workgroup per token: the top-k selection and gating of
// moe_topk.glsl over the token's router logits (logits[t * n_expert + e], the router's bias
// already added).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

#define TOPK_WG 64u

layout(local_size_x = 64) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer L { float logits[]; };
layout(std430, binding = 1) writeonly buffer Ids { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Wt { float wt[]; };

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_expert;
    uint n_used;
    uint gating;
    float scale;
} pc;

#include "moe_topk.glsl"

void main() {
    uint t = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (t >= pc.n_tokens) {
        return;
    }
    for (uint e = gl_LocalInvocationID.x; e < pc.n_expert; e += TOPK_WG) {
        lg[e] = logits[t * pc.n_expert + e];
    }
    barrier();
    route_token(t, pc.n_expert, pc.n_used, pc.gating, pc.scale);
}
