#version 450
// Benchmark only (linear_bench.rs `coopmat_probe`): the throughput of 16 x 16 x 16 f16 -> f32
// cooperative-matrix products on this device, each of 8 subgroups per workgroup running `iters`
// steps of FM x FN products on FM A and FN B fragments, with PROBE_SHARED reloading the
// fragments from shared memory every step (as matmul_coop.comp does), else keeping them in
// registers. Writes one accumulator per subgroup so nothing is optimized away.
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

#ifndef FM
#define FM 2u
#endif
#ifndef FN
#define FN 2u
#endif
#define LDA 18u

layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { float o[]; };
layout(push_constant) uniform Push { uint iters; } pc;

shared f16vec4 sh[128u * LDA];

void main() {
    uint tid = gl_LocalInvocationID.x;
    for (uint i = tid; i < 128u * LDA; i += 256u) {
        sh[i] = f16vec4(float16_t(float(i % 7u) * 0.001));
    }
    barrier();
    uint sg = gl_SubgroupID;
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[FM];
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[FN];
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[FM][FN];
    [[unroll]] for (uint i = 0u; i < FM; i++) {
        coopMatLoad(a[i], sh, (16u * i) * LDA, LDA, gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint j = 0u; j < FN; j++) {
            acc[i][j] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
        }
    }
    [[unroll]] for (uint j = 0u; j < FN; j++) {
        coopMatLoad(b[j], sh, (64u + 16u * j) * LDA, LDA, gl_CooperativeMatrixLayoutColumnMajor);
    }
    for (uint it = 0u; it < pc.iters; it++) {
#ifdef PROBE_SHARED
        uint kk = 4u * (it % 4u);
        [[unroll]] for (uint i = 0u; i < FM; i++) {
            coopMatLoad(a[i], sh, (16u * i) * LDA + kk, LDA, gl_CooperativeMatrixLayoutRowMajor);
        }
        [[unroll]] for (uint j = 0u; j < FN; j++) {
            coopMatLoad(b[j], sh, (64u + 16u * j) * LDA + kk, LDA,
                        gl_CooperativeMatrixLayoutColumnMajor);
        }
#endif
        [[unroll]] for (uint i = 0u; i < FM; i++) {
            [[unroll]] for (uint j = 0u; j < FN; j++) {
                acc[i][j] = coopMatMulAdd(a[i], b[j], acc[i][j]);
            }
        }
    }
    [[unroll]] for (uint i = 1u; i < FM; i++) {
        [[unroll]] for (uint j = 0u; j < FN; j++) {
            acc[0][0] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(
                acc[0][0] + acc[i][j]);
        }
    }
    coopMatStore(acc[0][0], o, (gl_WorkGroupID.x * 8u + sg) * 256u, 16u,
                 gl_CooperativeMatrixLayoutRowMajor);
}
