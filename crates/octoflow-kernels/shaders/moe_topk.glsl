// Top-k routing of one token, shared by moe_route.comp (logits from a buffer) and
// moe_router.comp (logits it has just computed): from lg[0 .. ne) select the n_used largest,
// ties to the lower expert (as sorting by value, then index), and write their ids and weights
// in selection order to ids[t * n_used + j] and wt[t * n_used + j]. Gating:
//   0  softmax over the selected logits only (gpt-oss, llama.cpp's SOFTMAX_WEIGHT);
//   1  softmax over every expert, the selected probabilities as they are (SOFTMAX);
//   2  as 1, then divided by their sum, at least 2^-14 (qwen3moe's expert_weights_norm).
// Every weight is then multiplied by `scale` (expert_weights_scale).
// Selection is k rounds over the experts not yet taken, by the workgroup's first subgroup
// alone (no barrier: a round is two subgroup reductions): each lane holds experts lane,
// lane + S, ... and offers its best; the subgroup's largest value wins, the lowest expert among
// the lanes offering it, so ties go as a total order on (value, index) — not as the device
// schedules invocations. The largest logit is the first selected, so the softmax needs no
// separate max pass.
// The includer defines TOPK_WG (its workgroup size) and the buffers `ids` (uint) and `wt`
// (float), enables the subgroup basic and arithmetic extensions, fills lg[0 .. ne) and calls
// route_token after a barrier (from every invocation: the other subgroups return at once).

// Host-checked limits (moe/route.rs): experts per token and experts.
#define MAX_USED 64u
#define MAX_EXPERTS 1024u
#define NONE 0xffffffffu

shared float lg[MAX_EXPERTS];
shared uint taken[MAX_EXPERTS];
shared uint sel[MAX_USED];

// Whether (v, i) ranks before (w, j): a larger value, or the same value at a lower index; an
// empty slot (NONE) ranks last.
bool before(float v, uint i, float w, uint j) {
    return i != NONE && (j == NONE || v > w || (v == w && i < j));
}

void route_token(uint t, uint ne, uint n_used, uint gating, float scale) {
    if (gl_SubgroupID != 0u) {
        return;
    }
    uint lane = gl_SubgroupInvocationID;
    uint sg = gl_SubgroupSize;
    for (uint e = lane; e < ne; e += sg) {
        taken[e] = 0u; // each expert's flag is only ever touched by its own lane
    }
    for (uint j = 0u; j < n_used; j++) {
        float best = 0.0;
        uint besti = NONE;
        for (uint e = lane; e < ne; e += sg) {
            if (taken[e] == 0u && before(lg[e], e, best, besti)) {
                best = lg[e];
                besti = e;
            }
        }
        float top = subgroupMax(besti == NONE ? uintBitsToFloat(0xff800000u) : best); // -inf
        uint s = subgroupMin(besti != NONE && best == top ? besti : NONE);
        if (s == NONE) {
            s = subgroupMin(besti); // every offer NaN: the lowest offered expert
        }
        if (s % sg == lane) {
            taken[s] = 1u;
        }
        sel[j] = s; // the same value from every lane
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    // the softmax's denominator: over every expert (gating 1, 2) or the selected ones (0)
    float m = lg[sel[0]];
    float part = 0.0;
    if (gating == 0u) {
        for (uint j = lane; j < n_used; j += sg) {
            part += exp(lg[sel[j]] - m);
        }
    } else {
        for (uint e = lane; e < ne; e += sg) {
            part += exp(lg[e] - m);
        }
    }
    float sum = subgroupAdd(part);
    if (subgroupElect()) {
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
