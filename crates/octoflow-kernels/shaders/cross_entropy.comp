#version 450
// Softmax cross-entropy per row and its gradient, in place. For row r < n_rows of logits
// [n_rows, n_vocab] f32 with label l = labels[labels_offset + r] and weight
// wt = weights[weights_offset + r]:
//   loss[r]      = wt * (logsumexp(logits[r]) - logits[r][l])
//   logits[r][i] = wt * (softmax(logits[r])[i] - (i == l ? 1 : 0))   (the gradient)
// and for an ignored row (l >= n_vocab, IGNORE = 0xFFFFFFFF included) loss 0 and gradient 0.
// One workgroup per row (2-D grid of rows, flat_group): pass 1 keeps a running max and sum of
// exps per invocation (rescaling the sum when the max grows), merged over the workgroup; pass 2
// rewrites each logit as its gradient (each invocation rewrites only what it read).
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
    for (uint i = tid; i < pc.n_vocab; i += gl_WorkGroupSize.x) {
        float x = logits[base + i];
        if (i == label) {
            x_label = x;
        }
        if (x > m) {
            s = s * exp(m - x) + 1.0;
            m = x;
        } else {
            s += exp(x - m);
        }
    }
    float mx = wg_max(m);
    // invocations that saw no element have m = -inf, s = 0: they add 0
    float sum = wg_sum(s == 0.0 ? 0.0 : s * exp(m - mx));
    if (owner) {
        // (max - x_label) is exact when the label holds the max: confident rows keep their
        // small losses
        loss[row] = wt * ((mx - x_label) + log(sum));
    }
    float inv = 1.0 / sum;
    for (uint i = tid; i < pc.n_vocab; i += gl_WorkGroupSize.x) {
        float p = exp(logits[base + i] - mx) * inv;
        logits[base + i] = wt * (i == label ? p - 1.0 : p);
    }
}
