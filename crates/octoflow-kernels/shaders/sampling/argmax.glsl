// Workgroup-wide argmax over `logits[row_base .. row_base + n)`, shared by argmax.comp and
// sample.comp (one workgroup per row; main sets `row_base`). Include after the `local_size`
// layout, the subgroup extensions and a `float logits[]` buffer declaration.
//
// The result is the CPU `argmax`: the first index of the largest value, comparing with `>` (so
// NaN is never chosen and -0.0 ties with +0.0), and 0 when no value beats -inf (empty, all NaN
// or all -inf). Every invocation must call it (it has barriers); every invocation gets the result.
// With ARGMAX_LSE defined, the includer's `void lse_add(float)` also sees every logit of the
// row (and -inf padding), so a log-sum-exp rides on the same pass over the vocabulary. With
// ARGMAX_MASK defined, the includer's `float argmax_mask(uint i, float v)` turns each value
// (after the log-sum-exp saw it) into what the argmax compares: NaN for a token it excludes.

uint row_base = 0u; // first logit of this workgroup's row

shared float am_val[gl_WorkGroupSize.x];
shared uint am_idx[gl_WorkGroupSize.x];
shared uint am_best;

// Whether (v, i) comes before (bv, bi): larger value first, then lower index.
bool am_before(float v, uint i, float bv, uint bi) {
    return v > bv || (v == bv && i < bi);
}

uint workgroup_argmax(uint n) {
    const uint L = gl_WorkGroupSize.x;
    uint tid = gl_LocalInvocationID.x;
    // Each invocation visits increasing indices, so a strict `>` keeps its first maximum.
    // Four independent loads per iteration keep more reads in flight.
    float bv = uintBitsToFloat(0xFF800000u); // -inf: never beaten by -inf or NaN, index 0
    uint bi = 0u;
    for (uint base = 0u; base < n; base += 4u * L) {
        float v[4];
        for (uint j = 0u; j < 4u; ++j) {
            uint i = base + j * L + tid;
            v[j] = i < n ? logits[row_base + i] : uintBitsToFloat(0xFF800000u);
        }
        for (uint j = 0u; j < 4u; ++j) {
#ifdef ARGMAX_LSE
            lse_add(v[j]);
#endif
#ifdef ARGMAX_MASK
            v[j] = argmax_mask(base + j * L + tid, v[j]);
#endif
            if (v[j] > bv) {
                bv = v[j];
                bi = base + j * L + tid;
            }
        }
    }
    // bv is never NaN; ties (including -0.0 against +0.0) go to the lowest index.
    float m = subgroupMax(bv);
    uint mi = subgroupMin(bv == m ? bi : 0xFFFFFFFFu);
    if (subgroupElect()) {
        am_val[gl_SubgroupID] = m;
        am_idx[gl_SubgroupID] = mi;
    }
    barrier();
    if (tid == 0u) {
        float best_v = am_val[0];
        uint best_i = am_idx[0];
        for (uint s = 1u; s < gl_NumSubgroups; ++s) {
            if (am_before(am_val[s], am_idx[s], best_v, best_i)) {
                best_v = am_val[s];
                best_i = am_idx[s];
            }
        }
        am_best = best_i;
    }
    barrier();
    return am_best;
}
