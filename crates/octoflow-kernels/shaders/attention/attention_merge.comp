#version 450
// Second pass of split-K attention (see attention.comp): combines the n_split partial results
// of each query row. part: [rows * n_split, head_dim_v] unnormalized accumulators, then
// [rows * n_split] (m, l) pairs (running max, sum of exp(s - m)); o [rows, head_dim_v].
//   o = sum_s exp(m_s - M) acc_s / (sum_s exp(m_s - M) l_s + exp(sink - M)),  M = max_s m_s
// (0 where no key seen), the sink term with has_sinks only: sinks[row % n_head], a column with
// no value in query head h's softmax (gpt-oss).
// One workgroup per row; invocation d (and d + 64, ...) owns output dim d.

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Part { float part[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
layout(std430, binding = 2) readonly buffer S { float sinks[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint head_dim_v;
    uint n_split;
    uint n_head;
    uint has_sinks;
} pc;

void main() {
    uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= pc.n_rows) {
        return;
    }
    uint mb = pc.n_rows * pc.n_split * pc.head_dim_v + 2u * row * pc.n_split;
    float mx = part[mb];
    for (uint s = 1; s < pc.n_split; s++) {
        mx = max(mx, part[mb + 2u * s]);
    }
    float l = 0.0;
    for (uint s = 0; s < pc.n_split; s++) {
        l += exp(part[mb + 2u * s] - mx) * part[mb + 2u * s + 1u];
    }
    if (pc.has_sinks != 0u) {
        l += exp(sinks[row % pc.n_head] - mx);
    }
    float inv = l > 0.0 ? 1.0 / l : 0.0; // 0: no key, or a sink beyond exp's range
    for (uint d = gl_LocalInvocationID.x; d < pc.head_dim_v; d += gl_WorkGroupSize.x) {
        float a = 0.0;
        uint ab = row * pc.n_split * pc.head_dim_v + d;
        for (uint s = 0; s < pc.n_split; s++) {
            a += exp(part[mb + 2u * s] - mx) * part[ab + s * pc.head_dim_v];
        }
        o[row * pc.head_dim_v + d] = a * inv;
    }
}
