#version 450
// Which recorded forward a VM step runs: a chain holds the batched forward once per row bucket,
// each in a gated span; this writes one skip flag per bucket from the row count vm_plan wrote
// (0 for the smallest bucket that holds the rows, 1 for every other; all 1 when the step has
// no rows), and the gate kernel turns each flag into its span's indirect arguments, so a step
// costs its bucket's rows instead of the recorded maximum.
#extension GL_GOOGLE_include_directive : require

#include "layout.glsl"

layout(local_size_x = 1) in;

// The step record vm_plan wrote.
layout(std430, binding = 0) readonly buffer Step { uint step[]; };
layout(std430, binding = 1) writeonly buffer Skip { uint skip[]; };

layout(push_constant) uniform Push {
    uint n_buckets;  // at most 8
    uint bound[8];   // rows of each bucket, increasing
} pc;

void main() {
    uint rows = step[P_ROWS];
    uint lower = 0u;
    for (uint j = 0u; j < pc.n_buckets; j++) {
        bool mine = rows > lower && rows <= pc.bound[j];
        skip[j] = mine ? 0u : 1u;
        lower = pc.bound[j];
    }
}
