// What vm_interpret and vm_advance share: u64 words, the step stamp, and how a generated token
// enters an instance (state.rs `Instance::accept`). Include after layout.glsl and the
// declarations of `hdr`, `inst`, `arena` and `tables`; `B` is the running instance's first word.

uint B;

// A u64 held as two words (low first) at `at` of the instance, plus one.
void inc64(uint at) {
    uint carry;
    inst[B + at] = uaddCarry(inst[B + at], 1u, carry);
    inst[B + at + 1u] += carry;
}

// (alo, ahi) < (blo, bhi) as u64.
bool lt64(uint alo, uint ahi, uint blo, uint bhi) {
    return ahi < bhi || (ahi == bhi && alo < blo);
}

// Whether a stamp written at (lo, hi) is before the step being run.
bool before_now(uint lo, uint hi) {
    return lt64(lo, hi, hdr[H_STEP_LO], hdr[H_STEP_HI]);
}

// Whether the span being generated (`gen` tokens at `off`) ends with the stop sequence of `len`
// tokens at `start` of the tables.
bool ends_with(uint off, uint gen, uint start, uint len) {
    bool match = len <= gen;
    for (uint j = 0u; match && j < len; j++) {
        match = arena[off + gen - len + j] == tables[start + j];
    }
    return match;
}

// Adds `token` to the span being generated and leaves it pending; returns whether the span is
// finished. The checks run in the host's order: an end-of-generation token, the longest stop
// sequence the span ends with (ties: the first declared), the limit, a full context.
// (One `return`, at the end: see vm_interpret.comp.)
bool vm_accept(uint token, float logprob) {
    bool finished = true;
    if (inst[B + I_HAS_LAST] != 0u) {
        uint off = inst[B + I_LAST_OFFSET];
        uint gen = inst[B + I_LAST_GENERATED];
        arena[off + gen] = token;
        gen += 1u;
        inst[B + I_LAST_GENERATED] = gen;
        inst[B + I_LAST_LEN] = gen;
        inst[B + I_HAS_PENDING] = 1u;
        inst[B + I_PENDING] = token;
        inc64(I_DRAWS_LO);
        inc64(I_GENERATED_LO);
        // The host's f32 sum and mean (`precise`: no reassociation or fused operations). Vulkan
        // lets division be off by 2.5 ulp where the host's is exact, so a score may differ from
        // the host's in its last bits (docs/VM.md, "Scores").
        precise float sum = uintBitsToFloat(inst[B + I_GEN_LOGPROB_SUM]) + logprob;
        inst[B + I_GEN_LOGPROB_SUM] = floatBitsToUint(sum);
        precise float score = sum / float(gen);
        inst[B + I_LAST_SCORE] = floatBitsToUint(score);

        uint finish = FIN_NONE;
        uint stop = 0u;
        uint trim = 0u;
        uint eog_at = hdr[H_T_EOG];
        for (uint k = 0u; k < hdr[H_N_EOG]; k++) {
            if (tables[eog_at + k] == token) {
                finish = FIN_EOG;
            }
        }
        uint set = inst[B + I_GEN_STOP];
        if (finish == FIN_EOG) {
            stop = 1u;
            trim = 1u;
        } else if (set != NO_STOP && set < hdr[H_N_STOPS]) {
            uint s = hdr[H_T_STOPS] + set * STOP_WORDS;
            uint first = tables[s];
            uint n = tables[s + 1u];
            uint best = NONE;
            uint best_len = 0u;
            for (uint k = 0u; k < n; k++) {
                uint q = hdr[H_T_SEQS] + (first + k) * SEQ_WORDS;
                uint len = tables[q + 1u];
                if ((best == NONE || len > best_len) && ends_with(off, gen, tables[q], len)) {
                    best = k;
                    best_len = len;
                }
            }
            if (best != NONE) {
                finish = FIN_STOP;
                stop = 2u + best;
                trim = best_len;
            }
        }
        if (finish == FIN_NONE && gen >= inst[B + I_GEN_LIMIT]) {
            finish = FIN_LENGTH;
        }
        // The pending token now fills the context at `pos + 1`.
        if (finish == FIN_NONE && inst[B + I_POS] + 1u >= hdr[H_N_CTX]) {
            finish = FIN_CONTEXT;
        }
        finished = finish != FIN_NONE;
        if (finished) {
            inst[B + I_LAST_FINISH] = finish;
            inst[B + I_LAST_STOP] = stop;
            inst[B + I_LAST_LEN] = gen - trim;
        }
    }
    return finished;
}
