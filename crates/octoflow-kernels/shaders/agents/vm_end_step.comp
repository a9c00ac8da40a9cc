#version 450
// The end of an agent VM step (octoflow_agents::Run::end_step is the reference): counts the
// live instances, flags a stall (no rows, nothing changed, some live: a deadlock the host
// reports after the submit) and moves the header to the next step, so a chain can hold many
// steps without the host between them.
#extension GL_GOOGLE_include_directive : require

#include "layout.glsl"

layout(local_size_x = PLAN_LOCAL) in;

layout(std430, binding = 0) buffer Hdr { uint hdr[]; };
layout(std430, binding = 1) readonly buffer Inst { uint inst[]; };
// The step record vm_plan wrote.
layout(std430, binding = 2) readonly buffer Step { uint step[]; };

shared uint live_part[PLAN_LOCAL];

void main() {
    uint t = gl_LocalInvocationID.x;
    uint n = hdr[H_N];
    uint live = 0u;
    for (uint i = t; i < n; i += PLAN_LOCAL) {
        uint st = inst[i * INST_WORDS + I_STATUS];
        if (st != ST_HALTED && st != ST_ERROR) {
            live += 1u;
        }
    }
    live_part[t] = live;
    barrier();
    for (uint w = PLAN_LOCAL / 2u; w > 0u; w /= 2u) {
        if (t < w) {
            live_part[t] += live_part[t + w];
        }
        barrier();
    }
    if (t == 0u) {
        uint total = live_part[0];
        if (step[P_ROWS] == 0u && hdr[H_CHANGED] == 0u && total > 0u) {
            hdr[H_STALLED] = 1u;
        }
        hdr[H_LIVE] = total;
        uint lo = hdr[H_STEP_LO] + 1u;
        hdr[H_STEP_LO] = lo;
        if (lo == 0u) {
            hdr[H_STEP_HI] += 1u;
        }
    }
}
