// Top-k routing of one token, shared by moe_route.comp (logits from a buffer) and
// moe_router.comp (logits it has just computed): from lg[0 .. ne) select the n_used largest,
// ties to the lower expert (as sorting by value, then index), and write their ids and weights
// in selection order to ids[t * n_used + j] and wt[t * n_used + j]. Gating:
//   0  softmax over the selected logits only (gpt-oss, llama.cpp's SOFTMAX_WEIGHT);
//   1  softmax over every expert, the selected probabilities as they are (SOFTMAX);
//   2  as 1, then divided by their sum, at least 2^-14 (qwen3moe's expert_weights_norm).
// Every weight is then multiplied by `scale` (expert_weights_scale).
// Selection is k rounds of a workgroup argmax over the experts not yet taken: a shared-memory
// tree whose comparisons are total on (value, index), so the result does not depend on how the
// device schedules invocations. The largest logit is the first selected, so the softmax needs no
// separate max pass.
// The includer defines TOPK_WG (its workgroup size, a power of two) and the buffers
// `ids` (uint) and `wt` (float), fills lg[0 .. ne) and calls route_token after a barrier.

// Host-checked limits (moe/route.rs): experts per token and experts.
#define MAX_USED 64u
#define MAX_EXPERTS 1024u
#define NONE 0xffffffffu

shared float lg[MAX_EXPERTS];
shared uint taken[MAX_EXPERTS];
shared float bv[TOPK_WG];
shared uint bi[TOPK_WG];
shared uint sel[MAX_USED];

// Whether (v, i) ranks before (w, j): a larger value, or the same value at a lower index; an
// empty slot (NONE) ranks last.
bool before(float v, uint i, float w, uint j) {
    return i != NONE && (j == NONE || v > w || (v == w && i < j));
}

void route_token(uint t, uint ne, uint n_used, uint gating, float scale) {
    uint tid = gl_LocalInvocationID.x;
    for (uint e = tid; e < ne; e += TOPK_WG) {
        taken[e] = 0u;
    }
    barrier();
    for (uint j = 0u; j < n_used; j++) {
        float best = 0.0;
        uint besti = NONE;
        for (uint e = tid; e < ne; e += TOPK_WG) {
            if (taken[e] == 0u && before(lg[e], e, best, besti)) {
                best = lg[e];
                besti = e;
            }
        }
        bv[tid] = best;
        bi[tid] = besti;
        barrier();
        for (uint s = TOPK_WG / 2u; s > 0u; s >>= 1) {
            if (tid < s && before(bv[tid + s], bi[tid + s], bv[tid], bi[tid])) {
                bv[tid] = bv[tid + s];
                bi[tid] = bi[tid + s];
            }
            barrier();
        }
        if (tid == 0u) {
            sel[j] = bi[0];
            taken[bi[0]] = 1u;
        }
        barrier();
    }
    // the softmax's denominator: over every expert (gating 1, 2) or the selected ones (0)
    float m = lg[sel[0]];
    float part = 0.0;
    if (gating == 0u) {
        for (uint j = tid; j < n_used; j += TOPK_WG) {
            part += exp(lg[sel[j]] - m);
        }
    } else {
        for (uint e = tid; e < ne; e += TOPK_WG) {
            part += exp(lg[e] - m);
        }
    }
    bv[tid] = part;
    barrier();
    for (uint s = TOPK_WG / 2u; s > 0u; s >>= 1) {
        if (tid < s) {
            bv[tid] += bv[tid + s];
        }
        barrier();
    }
    if (tid == 0u) {
        float sum = bv[0];
        float norm = 1.0;
        if (gating == 2u) {
            float ws = 0.0;
            for (uint j = 0u; j < n_used; j++) {
                ws += exp(lg[sel[j]] - m) / sum;
            }
            norm = 1.0 / max(ws, 6.103515625e-5);
        }
        for (uint j = 0u; j < n_used; j++) {
            uint o = t * n_used + j;
            ids[o] = sel[j];
            wt[o] = exp(lg[sel[j]] - m) / sum * norm * scale;
        }
    }
}
