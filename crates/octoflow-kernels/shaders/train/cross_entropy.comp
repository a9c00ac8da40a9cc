#version 450
// Softmax cross-entropy per row and its gradient, in place. For row r < n_rows of logits
// [n_rows, n_vocab] f32 with label l = labels[labels_offset + r] and weight
// wt = weights[weights_offset + r]:
//   loss[r]      = wt * (logsumexp(logits[r]) - logits[r][l])
//   logits[r][i] = wt * (softmax(logits[r])[i] - (i == l ? 1 : 0))   (the gradient)
// and for an ignored row (l >= n_vocab, IGNORE = 0xFFFFFFFF included) loss 0 and gradient 0.
// One workgroup per row (2-D grid of rows, flat_group): pass 1 keeps a running max and sum of
// exps per invocation (rescaling the sum when the max grows), merged over the workgroup; pass 2
// rewrites each logit as its gradient (each invocation rewrites only what it read). The label's
// loss and gradient come from the sum of the other terms (no cancellation near p = 1).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

#include "reduce.glsl"

layout(std430, binding = 0) buffer Logits { float logits[]; };
layout(std430, binding = 1) readonly buffer Labels { uint labels[]; };
layout(std430, binding = 2) readonly buffer Weights { float weights[]; };
layout(std430, binding = 3) writeonly buffer Loss { float loss[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_vocab;
    uint labels_offset;
    uint weights_offset;
} pc;

void main() {
    uint row = flat_group();
    if (row >= pc.n_rows) {
        return; // whole workgroup: uniform
    }
    uint tid = gl_LocalInvocationID.x;
    uint base = row * pc.n_vocab;
    uint label = labels[pc.labels_offset + row]; // the same for the whole workgroup
    if (label >= pc.n_vocab) {
        for (uint i = tid; i < pc.n_vocab; i += gl_WorkGroupSize.x) {
            logits[base + i] = 0.0;
        }
        if (tid == 0u) {
            loss[row] = 0.0;
        }
        return;
    }
    float wt = weights[pc.weights_offset + row];
    // The invocation owning the label's element (the only one that rewrites it) notes its logit
    // in pass 1 and writes the loss: no other invocation reads what pass 2 overwrites.
    bool owner = tid == label % gl_WorkGroupSize.x;
    float x_label = 0.0;
    float m = uintBitsToFloat(0xff800000u); // -inf: exp(m - x) = 0 on the first element
    float s = 0.0;
    float s_ex = 0.0; // the same sum without the label's term
    for (uint i = tid; i < pc.n_vocab; i += gl_WorkGroupSize.x) {
        float x = logits[base + i];
        float other = i == label ? 0.0 : 1.0;
        if (i == label) {
            x_label = x;
        }
        if (x > m) {
            float f = exp(m - x);
            s = s * f + 1.0;
            s_ex = s_ex * f + other;
            m = x;
        } else {
            float e = exp(x - m);
            s += e;
            s_ex += other * e;
        }
    }
    float mx = wg_max(m);

    // invocations that saw no element have m = -inf, s = 0: they add 0
    float sum = wg_sum(s == 0.0 ? 0.0 : s * exp(m - mx));
    float sum_ex = wg_sum(s_ex == 0.0 ? 0.0 : s_ex * exp(m - mx));
    // A confident row (p_label near 1) must not lose its small loss and label gradient to
    // cancellation: -log p = log1p(sum_ex / e_label) and p - 1 = -sum_ex / sum, where sum_ex
    // holds the other terms at full relative precision (p - 1 from a rounded p is off by
    // ~1e-7 absolute: 1.6e-4 relative at p = 0.9986, measured on the H100).
    if (owner) {
        float d = x_label - mx;
        float l;
        if (d > -20.0) {
            float u = sum_ex / exp(d);
            float w1 = 1.0 + u;
            l = w1 == 1.0 ? u : log(w1) * (u / (w1 - 1.0)); // log1p(u), Kahan's way
        } else {
            l = log(sum) - d; // the label's term is negligible: no cancellation
        }
        loss[row] = wt * l;
    }

    float inv = 1.0 / sum;
    for (uint i = tid; i < pc.n_vocab; i += gl_WorkGroupSize.x) {
        float p = exp(logits[base + i] - mx) * inv;
        logits[base + i] = wt * (i == label ? -sum_ex * inv : p);
    }
}
