#version 450
// End of one generation step: records the token the sampler wrote into the control block,
// moves the position on and decides whether generation stops (end-of-generation token, token
// limit, full context). One invocation; the control layout is `advance::ctl` on the host.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x = 1) in;

#include "common.glsl"

// Word indices of the control block (mirror of octoflow_kernels::advance::ctl).
const uint POS = 0u;
const uint TOKEN = 1u;
const uint N_GEN = 2u;
const uint STOP = 3u;
const uint MAX_GEN = 4u;
const uint N_CTX = 5u;
const uint N_OUT = 6u;
const uint N_EOG = 7u;
const uint EOG = 8u;
const uint MAX_EOG = 8u;

const uint STOP_EOG = 1u;
const uint STOP_LENGTH = 2u;
const uint STOP_CONTEXT = 3u;

layout(std430, binding = 0) buffer Ctl { uint ctl[]; };
layout(std430, binding = 1) buffer Out { uint out_tokens[]; };

layout(push_constant) uniform Push {
    uint n_fed;   // tokens this step ran through the model (positions to advance)
    uint out_len; // capacity of out_tokens
} pc;

void main() {
    if (ctl[STOP] != 0u) {
        return;
    }
    uint tok = ctl[TOKEN];
    uint n_out = ctl[N_OUT];
    if (n_out < pc.out_len) {
        out_tokens[n_out] = tok;
    }
    ctl[N_OUT] = n_out + 1u;
    uint n_gen = ctl[N_GEN] + 1u;
    ctl[N_GEN] = n_gen;
    uint pos = ctl[POS] + pc.n_fed;
    ctl[POS] = pos;

    bool eog = false;
    uint n_eog = min(ctl[N_EOG], MAX_EOG);
    for (uint i = 0u; i < n_eog; i++) {
        eog = eog || ctl[EOG + i] == tok;
    }
    uint stop = 0u;
    if (eog) {
        stop = STOP_EOG;
    } else if (n_gen >= ctl[MAX_GEN]) {
        stop = STOP_LENGTH;
    } else if (pos + 1u >= ctl[N_CTX]) {
        stop = STOP_CONTEXT;
    }
    ctl[STOP] = stop;
}
