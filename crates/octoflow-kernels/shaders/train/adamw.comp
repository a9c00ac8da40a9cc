#version 450
// AdamW step (PyTorch's decoupled weight decay) with HF-style global-norm clipping, f32, one
// invocation per parameter i < n:
//   g = grads[i] * grad_scale
//   norm = sqrt(sumsq[sumsq_offset]) * grad_scale          (sumsq: Σ raw grads², from sum_squares)
//   if max_grad_norm > 0 && norm > max_grad_norm: g *= max_grad_norm / (norm + 1e-6)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g²
//   p *= 1 - lr * wd
//   p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
// with step_size = lr / (1 - beta1^step) and bc2_sqrt = sqrt(1 - beta2^step) from the host.
// If zero_grads != 0, grads[i] = 0 afterwards.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 256) in;

#include "common.glsl"

layout(std430, binding = 0) buffer Params { float params[]; };
layout(std430, binding = 1) buffer Grads { float grads[]; };
layout(std430, binding = 2) buffer M { float m_buf[]; };
layout(std430, binding = 3) buffer V { float v_buf[]; };
layout(std430, binding = 4) readonly buffer SumSq { float sumsq[]; };

layout(push_constant) uniform Push {
    uint n;
    float beta1;
    float beta2;
    float eps;
    float decay;     // 1 - lr * weight_decay
    float step_size; // lr / (1 - beta1^step)
    float bc2_sqrt;  // sqrt(1 - beta2^step)
    float max_grad_norm;
    float grad_scale;
    uint zero_grads;
    uint sumsq_offset;
} pc;

void main() {
    uint i = global_index();
    if (i >= pc.n) {
        return;
    }
    // The same scalar in every invocation (one cached load).
    float norm = sqrt(sumsq[pc.sumsq_offset]) * pc.grad_scale;
    float g = grads[i] * pc.grad_scale;
    if (pc.max_grad_norm > 0.0 && norm > pc.max_grad_norm) {
        g *= pc.max_grad_norm / (norm + 1e-6);
    }
    float m = pc.beta1 * m_buf[i] + (1.0 - pc.beta1) * g;
    float v = pc.beta2 * v_buf[i] + (1.0 - pc.beta2) * (g * g);
    m_buf[i] = m;
    v_buf[i] = v;
    float p = params[i] * pc.decay;
    params[i] = p - pc.step_size * m / (sqrt(v) / pc.bc2_sqrt + pc.eps);
    if (pc.zero_grads != 0u) {
        grads[i] = 0.0;
    }
}
