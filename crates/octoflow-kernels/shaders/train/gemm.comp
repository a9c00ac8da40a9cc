#version 450
// Strided, batched f32 matrix product (see src/gemm.rs for the exact semantics):
//   C[b1, b2][i, j] = alpha * sum_{g < groups} sum_{kk < k} A[b1, b2, g][i, kk] * B[b1, b2 / b_div, g][kk, j]
//                     + beta * C[b1, b2][i, j]          (C is not read when beta == 0)
// Every operand is addressed through element strides (push constants), so transposes, head
// interleaving and grouped-query sharing are all just strides.
//
// One workgroup computes a TILE x TILE block of C: (TILE/4)^2 invocations, each a 4x4
// micro-tile of rows ty + r * TILE/4 and columns tx + c * TILE/4 (so a row's columns are
// written by consecutive invocations). K is walked in steps of BK staged in shared memory (A
// and B tiles stored k-major with one float of padding per row, so both load orders below are
// free of bank conflicts). Out-of-range rows/columns/ks load zeros and are not stored.
//
// Grid: x = tiles of n, y = tiles of m, z = batch b1 * batch[1] + b2; each axis loops with the
// grid's size as its step, so a dispatch clamped to maxComputeWorkGroupCount still covers
// everything. All loop bounds are workgroup-uniform (barriers inside are legal).

#ifndef TILE
#define TILE 64u
#endif
#ifndef LOCAL
#define LOCAL 256
#endif
#define TT (TILE / 4u) // invocations along one side of the tile
#define BK 16u
#define LD (TILE + 1u) // padded shared row length

layout(local_size_x = LOCAL) in;

layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) buffer C { float c[]; };

layout(push_constant) uniform Push {
    uint a_row, a_col, a_b1, a_b2, a_group;
    uint b_row, b_col, b_b1, b_b2, b_group;
    uint b_div;
    uint c_row, c_b1, c_b2;
    uint m, n, k, groups;
    uint n_b1, n_b2; // batch counts
    float alpha, beta;
} pc;

shared float As[BK * LD]; // As[kk * LD + i]
shared float Bs[BK * LD]; // Bs[kk * LD + j]

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint tx = lid % TT;
    uint ty = lid / TT;
    uint tiles_m = (pc.m + TILE - 1u) / TILE;
    uint tiles_n = (pc.n + TILE - 1u) / TILE;
    uint n_batch = pc.n_b1 * pc.n_b2;

    for (uint z = gl_WorkGroupID.z; z < n_batch; z += gl_NumWorkGroups.z) {
        uint bo = z / pc.n_b2;
        uint bi = z % pc.n_b2;
        uint a_batch = bo * pc.a_b1 + bi * pc.a_b2;
        uint b_batch = bo * pc.b_b1 + (bi / pc.b_div) * pc.b_b2;
        uint c_batch = bo * pc.c_b1 + bi * pc.c_b2;
        for (uint tm = gl_WorkGroupID.y; tm < tiles_m; tm += gl_NumWorkGroups.y) {
            uint i0 = tm * TILE;
            for (uint tn = gl_WorkGroupID.x; tn < tiles_n; tn += gl_NumWorkGroups.x) {
                uint j0 = tn * TILE;
                float acc[4][4];
                for (uint r = 0u; r < 4u; r++) {
                    for (uint q = 0u; q < 4u; q++) {
                        acc[r][q] = 0.0;
                    }
                }
                for (uint g = 0u; g < pc.groups; g++) {
                    uint a_base = a_batch + g * pc.a_group;
                    uint b_base = b_batch + g * pc.b_group;
                    for (uint k0 = 0u; k0 < pc.k; k0 += BK) {
                        // Stage A[i0.., k0..] and B[k0.., j0..]. The element order follows the
                        // operand's unit stride when it has one (coalesced global reads).
                        for (uint e = lid; e < TILE * BK; e += LOCAL) {
                            uint i, kk;
                            if (pc.a_col == 1u) {
                                kk = e % BK;
                                i = e / BK;
                            } else {
                                i = e % TILE;
                                kk = e / TILE;
                            }
                            uint gi = i0 + i;
                            uint gk = k0 + kk;
                            float v = 0.0;
                            if (gi < pc.m && gk < pc.k) {
                                v = a[a_base + gi * pc.a_row + gk * pc.a_col];
                            }
                            As[kk * LD + i] = v;
                        }
                        for (uint e = lid; e < TILE * BK; e += LOCAL) {
                            uint j, kk;
                            if (pc.b_col == 1u) {
                                j = e % TILE;
                                kk = e / TILE;
                            } else {
                                kk = e % BK;
                                j = e / BK;
                            }
                            uint gj = j0 + j;
                            uint gk = k0 + kk;
                            float v = 0.0;
                            if (gj < pc.n && gk < pc.k) {
                                v = b[b_base + gk * pc.b_row + gj * pc.b_col];
                            }
                            Bs[kk * LD + j] = v;
                        }
                        barrier();
                        for (uint kk = 0u; kk < BK; kk++) {
                            float av[4];
                            float bv[4];
                            for (uint r = 0u; r < 4u; r++) {
                                av[r] = As[kk * LD + ty + r * TT];
                                bv[r] = Bs[kk * LD + tx + r * TT];
                            }
                            for (uint r = 0u; r < 4u; r++) {
                                for (uint q = 0u; q < 4u; q++) {
                                    acc[r][q] = fma(av[r], bv[q], acc[r][q]);
                                }
                            }
                        }
                        barrier();
                    }
                }
                for (uint r = 0u; r < 4u; r++) {
                    uint gi = i0 + ty + r * TT;
                    if (gi >= pc.m) {
                        continue;
                    }
                    for (uint q = 0u; q < 4u; q++) {
                        uint gj = j0 + tx + q * TT;
                        if (gj < pc.n) {
                            uint idx = c_batch + gi * pc.c_row + gj;
                            float v = pc.alpha * acc[r][q];
                            if (pc.beta != 0.0) {
                                v = fma(pc.beta, c[idx], v);
                            }
                            c[idx] = v;
                        }
                    }
                }
            }
        }
    }
}
