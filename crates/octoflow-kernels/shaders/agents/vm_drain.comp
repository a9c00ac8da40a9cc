#version 450
// The end of a chain of agent VM steps (src/agents/vm_drain.rs; drain_ref is the reference):
// moves what the host reads into the chain's outbox, a host-visible buffer, and empties the
// event ring for the next chain. The outbox holds the header as the steps left it, the ring's
// unread events in ring order, each output's tokens gathered from the arena behind them (the
// event's offset rewritten to the outbox's), and Σ generated over the instances. With two
// chains and two outboxes the host reads one while the GPU runs the other.
//
// One workgroup: each invocation takes a contiguous run of events, a scan of the runs' token
// counts gives every output its place, then each copies its own events and tokens. If the
// tokens do not fit (O_OVERFLOW), events keep their arena offsets and no token is copied.
#extension GL_GOOGLE_include_directive : require

#include "layout.glsl"

layout(local_size_x = PLAN_LOCAL) in;

layout(std430, binding = 0) buffer Hdr { uint hdr[]; };
layout(std430, binding = 1) readonly buffer Inst { uint inst[]; };
layout(std430, binding = 2) readonly buffer Arena { uint arena[]; };
layout(std430, binding = 3) readonly buffer Events { uint events[]; };
layout(std430, binding = 4) writeonly buffer Outbox { uint outbox[]; };

layout(push_constant) uniform Push {
    uint token_cap; // tokens the outbox holds
} pc;

shared uint part[PLAN_LOCAL];
shared uint gen_lo[PLAN_LOCAL];
shared uint gen_hi[PLAN_LOCAL];
shared uint total_tokens;
shared uint bad; // an output span past the arena

// a + b as a two-word counter (lo, hi)
uvec2 add64(uvec2 a, uvec2 b) {
    uint lo = a.x + b.x;
    return uvec2(lo, a.y + b.y + (lo < a.x ? 1u : 0u));
}

void main() {
    uint t = gl_LocalInvocationID.x;
    uint cap = hdr[H_EV_CAP];
    uint read = hdr[H_EV_READ];
    uint pending = hdr[H_EV_HEAD] - read;
    // a ring that overflowed is the host's error (H_EV_LOST in the header copy)
    uint n_ev = cap == 0u ? 0u : min(pending, cap);
    uint chunk = (n_ev + PLAN_LOCAL - 1u) / PLAN_LOCAL;
    uint e0 = min(t * chunk, n_ev);
    uint e1 = min(e0 + chunk, n_ev);
    uint mine = 0u;
    for (uint e = e0; e < e1; e++) {
        uint at = ((read + e) % cap) * EVENT_WORDS;
        if (events[at + E_KIND] == EV_OUTPUT) {
            mine += events[at + E_LEN];
        }
    }
    part[t] = mine;
    uvec2 gen = uvec2(0u);
    uint n = hdr[H_N];
    for (uint i = t; i < n; i += PLAN_LOCAL) {
        uint b = i * INST_WORDS;
        gen = add64(gen, uvec2(inst[b + I_GENERATED_LO], inst[b + I_GENERATED_HI]));
    }
    gen_lo[t] = gen.x;
    gen_hi[t] = gen.y;
    if (t == 0u) {
        bad = 0u;
    }
    barrier();
    if (t == 0u) {
        uint run = 0u;
        uvec2 g = uvec2(0u);
        for (uint i = 0u; i < PLAN_LOCAL; i++) {
            uint v = part[i];
            part[i] = run;
            run += v;
            g = add64(g, uvec2(gen_lo[i], gen_hi[i]));
        }
        total_tokens = run;
        for (uint w = 0u; w < H_WORDS; w++) {
            outbox[w] = hdr[w];
        }
        outbox[O_EVENTS_N] = n_ev;
        outbox[O_TOKENS_N] = run;
        outbox[O_OVERFLOW] = run > pc.token_cap ? 1u : 0u;
        outbox[O_GEN_LO] = g.x;
        outbox[O_GEN_HI] = g.y;
    }
    barrier();
    bool overflow = total_tokens > pc.token_cap;
    uint tokens_at = O_EVENTS + cap * EVENT_WORDS;
    uint arena_cap = hdr[H_ARENA_CAP];
    uint off = part[t];
    for (uint e = e0; e < e1; e++) {
        uint at = ((read + e) % cap) * EVENT_WORDS;
        uint o = O_EVENTS + e * EVENT_WORDS;
        for (uint w = 0u; w < EVENT_WORDS; w++) {
            outbox[o + w] = events[at + w];
        }
        if (events[at + E_KIND] == EV_OUTPUT && !overflow) {
            uint src = events[at + E_OFFSET];
            uint len = events[at + E_LEN];
            if (src > arena_cap || len > arena_cap - src) {
                // the host reports the corrupt span (O_BAD); nothing is read out of bounds
                atomicOr(bad, 1u);
            } else {
                for (uint k = 0u; k < len; k++) {
                    outbox[tokens_at + off + k] = arena[src + k];
                }
            }
            outbox[o + E_OFFSET] = off;
            off += len;
        }
    }
    barrier();
    // every invocation read the ring's counters before the barriers above
    if (t == 0u) {
        outbox[O_BAD] = bad;
        hdr[H_EV_HEAD] = 0u;
        hdr[H_EV_READ] = 0u;
        hdr[H_EV_LOST] = 0u;
    }
}
