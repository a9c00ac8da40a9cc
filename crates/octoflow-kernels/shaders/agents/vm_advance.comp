#version 450
// Phase 3 of an agent VM step (octoflow_agents::plan::advance and state.rs `accept` are the
// reference): one invocation per instance takes the results of its rows, as vm_plan recorded
// them. A generating instance feeds its pending token and accepts the sampled one (stop sets,
// end-of-generation, limit, context); a feeding instance moves on by its rows and keeps the
// token of a feed's last row as the presample.
//
// Each token comes with its log-probability from the sampler (sample.comp), which vm_accept adds
// to the span's sum exactly as the host adds the engine's: a span's score is that sum over its
// length, what `best` compares.
#extension GL_GOOGLE_include_directive : require

#include "layout.glsl"

// One invocation per instance; the workgroup size is specialization constant 0
// (octoflow_kernels::agents::vm_local: VM_LOCAL, or CPU_LOCAL on a CPU driver).
layout(local_size_x_id = 0) in;

#include "common.glsl"

layout(std430, binding = 0) readonly buffer Hdr { uint hdr[]; };
layout(std430, binding = 1) buffer Inst { uint inst[]; };
layout(std430, binding = 2) buffer Arena { uint arena[]; };
layout(std430, binding = 3) readonly buffer Tables { uint tables[]; };
// The step record vm_plan wrote.
layout(std430, binding = 4) readonly buffer Step { uint step[]; };
// [2, max_out]: the token sampled for each output row, then the f32 bits of its log-probability.
layout(std430, binding = 5) readonly buffer Tokens { uint tokens[]; };

layout(push_constant) uniform Push {
    uint max_out;
} pc;

#include "vm.glsl"

void main() {
    uint i = global_index();
    uint n = hdr[H_N];
    uint p = P_INST + i * PI_WORDS;
    if (i < n && step[p + PI_COUNT] != 0u) {
        B = i * INST_WORDS;
        uint count = step[p + PI_COUNT];
        uint oi = step[p + PI_OUT];
        uint token = oi < pc.max_out ? tokens[oi] : 0u;
        // NaN where there is no output row (a feed's inner rows never read it).
        float logprob = oi < pc.max_out ? uintBitsToFloat(tokens[pc.max_out + oi])
                                        : uintBitsToFloat(0x7fc00000u);
        uint status = inst[B + I_STATUS];
        if (status == ST_GEN) {
            // The row fed the pending token at `pos`.
            inst[B + I_POS] += 1u;
            inst[B + I_HAS_PENDING] = 0u;
            inst[B + I_PENDING] = 0u;
            if (vm_accept(token, logprob)) {
                inst[B + I_STATUS] = ST_RUN;
            }
        } else if (status == ST_FEED) {
            inst[B + I_POS] += count;
            inst[B + I_FEED_CURSOR] += count;
            if (oi != NONE) {
                inst[B + I_HAS_PRESAMPLE] = 1u;
                inst[B + I_PRE_TOKEN] = token;
                inst[B + I_PRE_LOGPROB] = floatBitsToUint(logprob);
                inst[B + I_STATUS] = ST_RUN;
            }
        }
    }
}
