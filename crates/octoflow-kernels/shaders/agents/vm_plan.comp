#version 450
// Phase 2 of an agent VM step (octoflow_agents::plan::plan is the reference): which rows each
// instance gets, written as the tables the batched forward reads (octoflow-model's
// gpu/batch.rs: `IoSet`) plus the step record vm_advance reads.
//
// Rows go first to generating instances (one each, in instance order), then to feeding ones
// (in instance order, each min(remaining, chunk, max_rows - rows so far)). One workgroup scans
// the instances in blocks of PLAN_LOCAL: an instance's first row is a prefix sum. The feeders'
// running total is min(gen rows + wants so far, max_rows) — the host's sequential clamping
// gives exactly that — so it is a prefix sum saturating at max_rows.
#extension GL_GOOGLE_include_directive : require

#include "layout.glsl"

layout(local_size_x = PLAN_LOCAL) in;

layout(std430, binding = 0) readonly buffer Hdr { uint hdr[]; };
layout(std430, binding = 1) readonly buffer Inst { uint inst[]; };
layout(std430, binding = 2) readonly buffer Arena { uint arena[]; };
// [max_rows, 2]: (position, block table offset) per row (attention/page.glsl). The run's KV
// blocks are laid out per instance (slot s's block table at 2 max_rows + s * slot_blocks, the
// padding rows' one after the last slot's), written once by the host after these pairs.
layout(std430, binding = 3) writeonly buffer Table { uint table[]; };
// [max_rows]: token ids.
layout(std430, binding = 4) writeonly buffer Ids { uint ids[]; };
// [max_out]: the row of each output.
layout(std430, binding = 5) writeonly buffer OutRows { uint out_rows[]; };
// [max_rows]: adapter mix per row.
layout(std430, binding = 6) writeonly buffer Mix { uint mix[]; };
// [max_out, SAMPLER_WORDS]: sampler state per output.
layout(std430, binding = 7) writeonly buffer States { uint states[]; };
// The step record: P_* then PI_WORDS per instance.
layout(std430, binding = 8) writeonly buffer Step { uint step[]; };
// [max_rows]: each row's owner.
layout(std430, binding = 9) writeonly buffer Owners { uint owners[]; };

layout(push_constant) uniform Push {
    uint max_rows;
    uint max_out;
    uint n_slots; // the engine's KV slots: padding rows use the spare slot after them
    uint slot_blocks; // KV blocks of one slot's table
} pc;

// where the block table of `slot` starts in `table` (slot n_slots: the padding rows')
uint table_of(uint slot) {
    return 2u * pc.max_rows + slot * pc.slot_blocks;
}

shared uint s_rows[PLAN_LOCAL];
shared uint s_outs[PLAN_LOCAL];

uint sat_add(uint a, uint b, uint cap) {
    return a > cap - b ? cap : a + b;
}

// Inclusive scans over the workgroup of `rows` (saturating at `cap`; values <= cap) and of
// `outs` (plain), in s_rows and s_outs.
void scan(uint rows, uint outs, uint cap) {
    uint lid = gl_LocalInvocationID.x;
    s_rows[lid] = rows;
    s_outs[lid] = outs;
    barrier();
    for (uint d = 1u; d < PLAN_LOCAL; d <<= 1u) {
        uint r = rows;
        uint o = outs;
        if (lid >= d) {
            r = sat_add(s_rows[lid - d], rows, cap);
            o = s_outs[lid - d] + outs;
        }
        barrier();
        s_rows[lid] = r;
        s_outs[lid] = o;
        rows = r;
        outs = o;
        barrier();
    }
}

void write_row(uint r, uint i, uint pos, uint token, bool samples, uint oi) {
    uint b = i * INST_WORDS;
    table[2u * r] = pos;
    table[2u * r + 1u] = table_of(inst[b + I_ID]);
    ids[r] = token;
    mix[r] = MIX_BASE;
    owners[r] = i | (samples ? OWNER_SAMPLES : 0u);
    if (samples && oi < pc.max_out) {
        out_rows[oi] = r;
        uint s = oi * SAMPLER_WORDS;
        states[s] = inst[b + I_SEED_LO];
        states[s + 1u] = inst[b + I_SEED_HI];
        states[s + 2u] = inst[b + I_DRAWS_LO];
        states[s + 3u] = inst[b + I_DRAWS_HI];
        states[s + 4u] = hdr[H_TEMPERATURE];
        states[s + 5u] = hdr[H_TOP_K];
        states[s + 6u] = hdr[H_TOP_P];
        states[s + 7u] = hdr[H_MIN_P];
    }
}

void record(uint i, uint first, uint count, uint oi) {
    uint p = P_INST + i * PI_WORDS;
    step[p + PI_FIRST] = first;
    step[p + PI_COUNT] = count;
    step[p + PI_OUT] = oi;
}

// Token `k` of instance `b`'s feed: the pending token it starts with, then arena tokens.
uint feed_token(uint b, uint k) {
    if (inst[b + I_FEED_HAS_FIRST] != 0u) {
        return k == 0u ? inst[b + I_FEED_FIRST] : arena[inst[b + I_FEED_OFFSET] + k - 1u];
    }
    return arena[inst[b + I_FEED_OFFSET] + k];
}

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint n = hdr[H_N];
    uint cap = pc.max_rows;

    // Generating instances: one row each, while rows last.
    uint gen_base = 0u;
    for (uint block = 0u; block < n; block += PLAN_LOCAL) {
        uint i = block + lid;
        uint b = i * INST_WORDS;
        bool gen = i < n && inst[b + I_STATUS] == ST_GEN && inst[b + I_HAS_PENDING] != 0u;
        scan(gen ? 1u : 0u, 0u, 0xffffffffu);
        uint row = gen_base + s_rows[lid] - (gen ? 1u : 0u);
        if (i < n && inst[b + I_STATUS] != ST_FEED) {
            if (gen && row < cap) {
                write_row(row, i, inst[b + I_POS], inst[b + I_PENDING], true, row);
                record(i, row, 1u, row);
            } else {
                record(i, 0u, 0u, NONE);
            }
        }
        gen_base += s_rows[PLAN_LOCAL - 1u];
        barrier();
    }
    uint gen_rows = min(gen_base, cap);

    // Feeding instances: min(remaining, chunk, room) rows each; an output on a feed's last row.
    uint rows = gen_rows;
    uint outs = gen_rows;
    for (uint block = 0u; block < n; block += PLAN_LOCAL) {
        uint i = block + lid;
        uint b = i * INST_WORDS;
        bool feed = i < n && inst[b + I_STATUS] == ST_FEED;
        uint total = feed ? inst[b + I_FEED_LEN] + inst[b + I_FEED_HAS_FIRST] : 0u;
        uint cursor = feed ? inst[b + I_FEED_CURSOR] : 0u;
        uint want = feed ? min(min(total - cursor, hdr[H_CHUNK]), cap) : 0u;
        scan(want, 0u, cap);
        uint first = sat_add(rows, lid == 0u ? 0u : s_rows[lid - 1u], cap);
        uint count = sat_add(rows, s_rows[lid], cap) - first;
        uint block_rows = s_rows[PLAN_LOCAL - 1u];
        bool samples = feed && count > 0u && cursor + count == total;
        barrier();
        scan(0u, samples ? 1u : 0u, cap);
        uint oi = outs + s_outs[lid] - (samples ? 1u : 0u);
        uint block_outs = s_outs[PLAN_LOCAL - 1u];
        if (feed) {
            for (uint k = 0u; k < count; k++) {
                bool last = cursor + k + 1u == total;
                write_row(first + k, i, inst[b + I_POS] + k, feed_token(b, cursor + k), last, oi);
            }
            record(i, count > 0u ? first : 0u, count, samples ? oi : NONE);
        }
        rows = sat_add(rows, block_rows, cap);
        outs += block_outs;
        barrier();
    }

    if (lid == 0u) {
        step[P_ROWS] = rows;
        step[P_OUTS] = outs;
        step[P_GEN_ROWS] = gen_rows;
        step[P_GEN_ROWS + 1u] = 0u;
    }
    // Padding: rows write and read the spare KV slot only; outputs sample row 0 greedily.
    for (uint r = rows + lid; r < cap; r += PLAN_LOCAL) {
        table[2u * r] = 0u;
        table[2u * r + 1u] = table_of(pc.n_slots);
        ids[r] = 0u;
        mix[r] = MIX_BASE;
        owners[r] = NONE;
    }
    for (uint o = outs + lid; o < pc.max_out; o += PLAN_LOCAL) {
        out_rows[o] = 0u;
        for (uint w = 0u; w < SAMPLER_WORDS; w++) {
            states[o * SAMPLER_WORDS + w] = 0u;
        }
    }
}
