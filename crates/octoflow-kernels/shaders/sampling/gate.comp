#version 450
// Gate of one step of a multi-step chain: copies the step's indirect-dispatch arguments from
// their template, or zeros when generation has stopped, so every gated dispatch of the step runs
// normally or does nothing (see octoflow_vk's gated spans).
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 64) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer Ctl { uint ctl[]; };
layout(std430, binding = 1) readonly buffer Template { uint template_words[]; };
layout(std430, binding = 2) writeonly buffer Args { uint args[]; };

layout(push_constant) uniform Push {
    uint n_words;   // 3 per gated dispatch
    uint stop_word; // index of the stop flag in ctl
} pc;

void main() {
    bool stopped = ctl[pc.stop_word] != 0u;
    for (uint i = gl_LocalInvocationID.x; i < pc.n_words; i += gl_WorkGroupSize.x) {
        args[i] = stopped ? 0u : template_words[i];
    }
}
