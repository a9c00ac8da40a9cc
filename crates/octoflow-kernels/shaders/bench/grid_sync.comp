#version 450
// Benchmark kernel (linear_bench::dispatch_overhead, never used by the model): `n_iter`
// grid-wide barriers inside one dispatch. Invocation 0 of each workgroup announces its arrival
// with an atomic add on `count` and spins until every workgroup of the dispatch has arrived for
// this round. It needs every workgroup resident at once (no forward-progress guarantee for
// spinning workgroups in Vulkan), so the benchmark launches at most one per SM and only on a
// discrete GPU. Measures what a persistent decode kernel's barrier would cost against a
// dispatch + pipeline barrier.
layout(local_size_x = 128) in;

layout(std430, binding = 0) coherent buffer C { uint count; };

layout(push_constant) uniform Push { uint n_iter; } pc;

void main() {
    uint groups = gl_NumWorkGroups.x;
    for (uint it = 1u; it <= pc.n_iter; it++) {
        barrier();
        if (gl_LocalInvocationIndex == 0u) {
            memoryBarrierBuffer();
            atomicAdd(count, 1u);
            while (atomicAdd(count, 0u) < it * groups) {
            }
            memoryBarrierBuffer();
        }
        barrier();
    }
}
