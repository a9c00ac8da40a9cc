#version 450
// Quantized linear layer for CPU Vulkan drivers (lavapipe), chosen by the host on
// DeviceKind::Cpu with 8-wide subgroups:
//   y[t * y_stride + y_col + r] (= | +=) dot(W row r, x[t]) (+ bias[r]),  t < n_tokens, r < n_rows.
// W: n_rows rows in their GGUF encoding (quant.glsl, type from the QTYPE_* define), row r at byte
// r * row_bytes. x: [n_tokens, n_cols] f32.
//
// llvmpipe runs a subgroup as one SIMD vector, and every buffer load, even one with a uniform
// address, is a loop over the lanes with a bounds check per component. So the cost is the number
// of loaded scalars: each is loaded once per subgroup and reused from registers. Every invocation
// owns R weight rows (its own words of W) and the tokens are the same for the whole workgroup:
// per 32-element chunk and token, lane l loads x elements [4l, 4l + 4) as one vec4 and the
// subgroup broadcasts them to all lanes (a register shuffle), and each dequantized weight chunk
// is reused for TN tokens. R x TN sums live in registers (constant-trip, unrolled loops); no
// shared memory, no barriers. Workgroup (x, y) = (WG * R rows, TN tokens); TN comes from the
// variant's defines.
//
// GLU variants (GLU defined: matvec_glu_cpu_<type>), as matvec.comp's without the fused norm:
//   y[t * y_stride + y_col + r] = act(dot(W row r, x[t])) * dot(W2 row r, x[t]),
// W the gate matrix, W2 the up matrix (binding 5, same type and shape), act from the push
// constant `act` (glu.glsl); bias and accumulate do not apply. Each broadcast x value feeds both
// products.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require

#define SG 8u // the subgroup size the host guarantees
#define WG 32u
#define R 4u

layout(local_size_x = 32) in;

layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };
#ifdef GLU
layout(std430, binding = 5) readonly buffer W2 { uint w2[]; };
#endif

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint n_tokens;
    uint y_stride;
    uint y_col;
    uint row_bytes;
    uint flags; // bit 0: add bias, bit 1: accumulate into y
#ifdef GLU
    float eps;  // matvec.comp's push-constant layout: eps and norm unused here (no fused norm)
    uint norm;
    uint act;   // glu.glsl's op: 0 SiLU, 1 GELU-tanh
#endif
} pc;

#define QCPU 1
#include "quant.glsl"
#ifdef GLU
#define QSECOND
#include "quant.glsl" // dequant_chunk_2 reads w2
#undef QSECOND
#include "glu.glsl"
#endif

void main() {
    uint lane = gl_SubgroupInvocationID;
    uint row0 = gl_WorkGroupID.x * (WG * R) + gl_LocalInvocationID.x;
    uint tok0 = gl_WorkGroupID.y * TN;
    uint nt = min(pc.n_tokens - tok0, TN);

    // Rows row0 + WG k; lanes past the last row decode the last row and store nothing.
    uint rb[R];
    float acc[R][TN];
#ifdef GLU
    float acc2[R][TN];
#endif
    [[unroll]] for (uint k = 0u; k < R; k++) {
        rb[k] = min(row0 + WG * k, pc.n_rows - 1u) * pc.row_bytes;
        [[unroll]] for (uint t = 0u; t < TN; t++) {
            acc[k][t] = 0.0;
#ifdef GLU
            acc2[k][t] = 0.0;
#endif
        }
    }

    uint nc = chunk_count(pc.n_cols);
    for (uint c = 0u; c < nc; c++) {
        float v[R][32];
        [[unroll]] for (uint k = 0u; k < R; k++) {
            dequant_chunk(rb[k], c, pc.n_cols, v[k]);
        }
#ifdef GLU
        float v2[R][32];
        [[unroll]] for (uint k = 0u; k < R; k++) {
            dequant_chunk_2(rb[k], c, pc.n_cols, v2[k]);
        }
#endif
        uint xb = tok0 * pc.n_cols + 32u * c;
#ifdef QDENSE
        // A partial last chunk: v is 0 past the row's end; x is read clamped to it.
        uint last = chunk_len(c, pc.n_cols) - 1u;
#endif
        [[unroll]] for (uint t = 0u; t < TN; t++) {
            if (t < nt) {
                uint xt = xb + t * pc.n_cols;
#ifdef QDENSE
                uint e = 4u * lane;
                vec4 xv = vec4(x[xt + min(e, last)], x[xt + min(e + 1u, last)],
                               x[xt + min(e + 2u, last)], x[xt + min(e + 3u, last)]);
#else
                vec4 xv = x4[(xt >> 2) + lane];
#endif
                [[unroll]] for (uint q = 0u; q < 8u; q++) {
                    vec4 b = subgroupBroadcast(xv, q);
                    [[unroll]] for (uint k = 0u; k < R; k++) {
                        acc[k][t] += v[k][4u * q] * b.x;
                        acc[k][t] += v[k][4u * q + 1u] * b.y;
                        acc[k][t] += v[k][4u * q + 2u] * b.z;
                        acc[k][t] += v[k][4u * q + 3u] * b.w;
#ifdef GLU
                        acc2[k][t] += v2[k][4u * q] * b.x;
                        acc2[k][t] += v2[k][4u * q + 1u] * b.y;
                        acc2[k][t] += v2[k][4u * q + 2u] * b.z;
                        acc2[k][t] += v2[k][4u * q + 3u] * b.w;
#endif
                    }
                }
            }
        }
    }

    [[unroll]] for (uint k = 0u; k < R; k++) {
        uint r = row0 + WG * k;
        if (r < pc.n_rows) {
#ifdef GLU
            [[unroll]] for (uint t = 0u; t < TN; t++) {
                if (t < nt) {
                    uint o = (tok0 + t) * pc.y_stride + pc.y_col + r;
                    y[o] = glu_act(acc[k][t], pc.act) * acc2[k][t];
                }
            }
#else
            float bv = (pc.flags & 1u) != 0u ? bias[r] : 0.0;
            [[unroll]] for (uint t = 0u; t < TN; t++) {
                if (t < nt) {
                    uint o = (tok0 + t) * pc.y_stride + pc.y_col + r;
                    float s = acc[k][t] + bv;
                    if ((pc.flags & 2u) != 0u) {
                        s += y[o];
                    }
                    y[o] = s;
                }
            }
#endif
        }
    }
}
