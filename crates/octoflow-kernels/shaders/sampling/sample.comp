#version 450
// Draws one token from a row of logits with the sampler state in a device buffer, exactly as the
// CPU sampler (octoflow-core `Sampler::sample`, no penalties):
//   temperature <= 0: argmax;
//   otherwise top-k -> softmax -> top-p -> min-p -> softmax(logit / temperature) -> draw with
//   u = SplitMix64 hash of (seed, step), candidates ordered by logit descending (f32 total order),
//   ties by token id ascending, NaN logits never candidates (all NaN: token 0).
// Then out[out_offset] = token and the state's step advances by one (always, as the CPU's).
// Rows: workgroup r draws from logits row r with state r (8 words each) into out[out_offset + r].
// Unless lp_offset is NO_LOGPROB, out[lp_offset + r] also gets the f32 bits of the token's
// log-probability at temperature 1, log softmax(logits)[token] (octoflow-core `logprob`): the
// running max and sum of exp(l - max) ride on a pass the draw makes anyway (the argmax scan, or
// the first radix pass), so the vocabulary is still read as often as without it.
//
// One workgroup. Top-k without sorting the vocabulary: a 4-pass radix select (8 bits a pass) on
// the logits' order-preserving keys finds the key T of the k-th largest candidate; if more logits
// than needed equal T, more radix passes over their token ids keep the lowest ids. Then the exact
// k candidates are gathered into shared memory, ranked, and the rest runs there.
//
// MASKED (variant `sample_masked`): a grammar's token mask per row at binding 3, row r at word
// r * mask_words: word 0 is the row's flag (0: unconstrained, the mask is not read), then one
// bit per token (bit i % 32 of word 1 + i / 32; set: allowed). A masked-out token is treated as
// a NaN logit — never a candidate — after the log-probability's log-sum-exp has seen its real
// value (the log-probability stays the model's). When no allowed logit beats -inf, the token is
// the lowest allowed id (0 if none is): the CPU reference `sample_masked_ref`, octoflow-core's
// `Sampler::sample_masked`.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(local_size_x = 256) in;

// Largest top_k handled (candidates live in shared memory, one per invocation); the Rust side's
// MAX_TOP_K.
#define MAX_TOP_K 256u

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
// SamplerState: seed_lo, seed_hi, step_lo, step_hi, temperature, top_k, top_p, min_p.
layout(std430, binding = 1) buffer State { uint state[]; };
layout(std430, binding = 2) writeonly buffer Out { uint outv[]; };

#ifdef MASKED
layout(std430, binding = 3) readonly buffer Mask { uint maskw[]; };
layout(push_constant) uniform Push {
    uint n_vocab; uint out_offset; uint lp_offset; uint mask_words;
} pc;
#else
layout(push_constant) uniform Push { uint n_vocab; uint out_offset; uint lp_offset; } pc;
#endif

// lp_offset meaning "write no log-probabilities" (the Rust side's None).
#define NO_LOGPROB 0xFFFFFFFFu
#define NEG_INF uintBitsToFloat(0xFF800000u)

// This invocation's share of the row's log-sum-exp, online: the largest logit seen and the sum
// of exp(l - lse_m) over those seen (rescaled when the max grows, so no second pass).
float lse_m = NEG_INF;
float lse_s = 0.0;

// Whether this dispatch writes log-probabilities (main sets it from the push constant): a
// uniform branch, so callers that want none (the decode chains) pay no exp per logit.
bool lse_on = false;

// -inf adds nothing (and would make exp(-inf - -inf) NaN); NaN poisons the sum, as on the CPU.
void lse_add(float v) {
    if (!lse_on) {
        // nothing to accumulate
    } else if (v > lse_m) {
        lse_s = lse_s * exp(lse_m - v) + 1.0;
        lse_m = v;
    } else if (v != NEG_INF) {
        lse_s += exp(v - lse_m);
    }
}

// This row's mask: whether it has one, and the word where its bits start.
bool row_masked = false;
uint mask_base = 0u;

// The value a masked row's sampler sees for token i (padding past the row passes as is).
float masked(uint i, float v) {
#ifdef MASKED
    if (row_masked && i < pc.n_vocab && ((maskw[mask_base + (i >> 5u)] >> (i & 31u)) & 1u) == 0u) {
        return uintBitsToFloat(0x7FC00000u);
    }
#endif
    return v;
}

float argmax_mask(uint i, float v) {
    return masked(i, v);
}

#define ARGMAX_LSE
#define ARGMAX_MASK
#include "argmax.glsl"

shared float lse_mv[gl_WorkGroupSize.x];
shared float lse_sv[gl_WorkGroupSize.x];
shared float s_lse_m, s_lse_s;

// A partial sum `s` over max `m`, rescaled to max `to` (an empty part stays 0, not NaN).
float lse_rescale(float s, float m, float to) {
    return s == 0.0 ? 0.0 : s * exp(m - to);
}

// Merges every invocation's (lse_m, lse_s) into s_lse_m, s_lse_s. Every invocation calls it.
void workgroup_lse() {
    uint tid = gl_LocalInvocationID.x;
    float m = subgroupMax(lse_m);
    float s = subgroupAdd(lse_rescale(lse_s, lse_m, m));
    if (subgroupElect()) {
        lse_mv[gl_SubgroupID] = m;
        lse_sv[gl_SubgroupID] = s;
    }
    barrier();
    if (tid == 0u) {
        float mm = NEG_INF;
        for (uint g = 0u; g < gl_NumSubgroups; ++g) {
            mm = max(mm, lse_mv[g]);
        }
        float ss = 0.0;
        for (uint g = 0u; g < gl_NumSubgroups; ++g) {
            ss += lse_rescale(lse_sv[g], lse_mv[g], mm);
        }
        s_lse_m = mm;
        s_lse_s = ss;
    }
    barrier();
}

shared uint s_word[8];
shared uint hist[256];
shared uint s_prefix, s_mask, s_rem, s_ties, s_kk, s_count, s_choice;
shared uint c_key[MAX_TOP_K];
shared uint c_idx[MAX_TOP_K];
shared float c_val[MAX_TOP_K];
shared uint c_tok[MAX_TOP_K];
shared float e1[MAX_TOP_K];
shared float e2[MAX_TOP_K];

// ---- 64-bit arithmetic on (lo, hi) pairs, for SplitMix64 without shaderInt64 ----
uvec2 mul64(uvec2 a, uvec2 b) {
    uint hi, lo;
    umulExtended(a.x, b.x, hi, lo);
    return uvec2(lo, hi + a.x * b.y + a.y * b.x);
}
uvec2 add64(uvec2 a, uvec2 b) {
    uint carry;
    uint lo = uaddCarry(a.x, b.x, carry);
    return uvec2(lo, a.y + b.y + carry);
}
// a >> s for 0 < s < 32.
uvec2 shr64(uvec2 a, uint s) {
    return uvec2((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}

// octoflow-core `uniform(seed, step)`: a number in [0, 1) with 24 random bits.
float uniform01(uvec2 seed, uvec2 step) {
    uvec2 z = seed ^ add64(mul64(step, uvec2(0x7F4A7C15u, 0x9E3779B9u)),
                           uvec2(0xD192ED03u, 0xD1B54A32u));
    z = mul64(z ^ shr64(z, 30u), uvec2(0x1CE4E5B9u, 0xBF58476Du));
    z = mul64(z ^ shr64(z, 27u), uvec2(0x133111EBu, 0x94D049BBu));
    z ^= shr64(z, 31u);
    return float(z.y >> 8u) / 16777216.0;
}

// Order-preserving key of a non-NaN float: unsigned order of keys = f32 total order (so
// -0.0 < +0.0). Non-NaN keys are >= 0x007FFFFF (that of -inf).
uint order_key(float v) {
    uint b = floatBitsToUint(v);
    return (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
}
float key_value(uint k) {
    return uintBitsToFloat((k & 0x80000000u) != 0u ? (k & 0x7FFFFFFFu) : ~k);
}

// One radix pass: histogram of the 8-bit digit at `shift` over the logits whose key matches
// s_prefix under s_mask (by_id false), or over the token ids of the logits whose key is `t` and
// whose id matches s_prefix under s_mask (by_id true). With `lse`, every logit of the row also
// goes to lse_add. Ends with hist complete (barrier).
void radix_histogram(uint n, uint shift, bool by_id, uint t, bool lse) {
    const uint L = gl_WorkGroupSize.x;
    uint tid = gl_LocalInvocationID.x;
    hist[tid] = 0u;
    barrier();
    uint prefix = s_prefix;
    uint mask = s_mask;
    for (uint base = 0u; base < n; base += 4u * L) {
        float v[4];
        for (uint j = 0u; j < 4u; ++j) {
            uint i = base + j * L + tid;
            v[j] = i < n ? logits[row_base + i] : uintBitsToFloat(0x7FC00000u);
        }
        for (uint j = 0u; j < 4u; ++j) {
            uint i = base + j * L + tid;
            if (lse && i < n) {
                lse_add(v[j]);
            }
            v[j] = masked(i, v[j]);
            if (isnan(v[j])) {
                continue;
            }
            uint k = order_key(v[j]);
            if (by_id) {
                if (k == t && (i & mask) == prefix) {
                    atomicAdd(hist[(i >> shift) & 255u], 1u);
                }
            } else if ((k & mask) == prefix) {
                atomicAdd(hist[(k >> shift) & 255u], 1u);
            }
        }
    }
    barrier();
}

// Invocation 0, after radix_histogram: picks the bin holding the s_rem-th item counting from the
// top bin down (keys, descending) or from bin 0 up (ids, ascending), narrows the prefix to it.
void radix_choose(uint shift, bool ascending) {
    uint rem = s_rem;
    uint acc = 0u;
    uint b = ascending ? 0u : 255u;
    // Terminates: the items matching the prefix number at least rem.
    for (uint step = 0u; step < 255u; ++step) {
        if (acc + hist[b] >= rem) {
            break;
        }
        acc += hist[b];
        b = ascending ? b + 1u : b - 1u;
    }
    s_rem = rem - acc;
    s_ties = hist[b];
    s_prefix |= b << shift;
    s_mask |= 255u << shift;
}

uint sample_top_k(uint n, float temperature) {
    const uint L = gl_WorkGroupSize.x;
    uint tid = gl_LocalInvocationID.x;
    uint top_k = clamp(s_word[5], 1u, MAX_TOP_K);

    // Key of the k-th largest candidate (k = min(top_k, non-NaN count)).
    if (tid == 0u) {
        s_prefix = 0u;
        s_mask = 0u;
    }
    for (uint pass = 0u; pass < 4u; ++pass) {
        uint shift = 24u - 8u * pass;
        radix_histogram(n, shift, false, 0u, pass == 0u);
        if (tid == 0u) {
            if (pass == 0u) {
                uint total = 0u;
                for (uint b = 0u; b < 256u; ++b) {
                    total += hist[b];
                }
                s_kk = min(top_k, total);
                s_rem = s_kk;
            }
            if (s_kk > 0u) {
                radix_choose(shift, false);
            }
        }
        barrier();
        if (s_kk == 0u) {
            return 0u; // every logit is NaN
        }
    }
    uint t = s_prefix;
    uint kk = s_kk;

    // More logits equal t than fit: keep the s_rem lowest ids among them.
    uint id_limit = 0xFFFFFFFFu;
    if (s_ties > s_rem) {
        barrier();
        if (tid == 0u) {
            s_prefix = 0u;
            s_mask = 0u;
        }
        for (uint pass = 0u; pass < 4u; ++pass) {
            uint shift = 24u - 8u * pass;
            if (shift > 0u && ((n - 1u) >> shift) == 0u) {
                continue; // every id has a zero digit here
            }
            radix_histogram(n, shift, true, t, false);
            if (tid == 0u) {
                radix_choose(shift, true);
            }
            barrier();
        }
        id_limit = s_prefix;
    }

    // Gather the exactly kk candidates: key > t, or key == t and id <= id_limit.
    if (tid == 0u) {
        s_count = 0u;
    }
    barrier();
    for (uint i = tid; i < n; i += L) {
        float v = masked(i, logits[row_base + i]);
        if (isnan(v)) {
            continue;
        }
        uint k = order_key(v);
        if (k > t || (k == t && i <= id_limit)) {
            uint slot = atomicAdd(s_count, 1u);
            if (slot < MAX_TOP_K) {
                c_key[slot] = k;
                c_idx[slot] = i;
            }
        }
    }
    barrier();

    // Rank sort: logit descending (total order), then id ascending; pairs are distinct.
    if (tid < kk) {
        uint k = c_key[tid];
        uint id = c_idx[tid];
        uint rank = 0u;
        for (uint j = 0u; j < kk; ++j) {
            uint kj = c_key[j];
            if (kj > k || (kj == k && c_idx[j] < id)) {
                rank += 1u;
            }
        }
        c_val[rank] = key_value(k);
        c_tok[rank] = id;
    }
    barrier();

    // Unnormalised softmax terms, before and after temperature (max = the first candidate).
    if (tid < kk) {
        float v = c_val[tid];
        e1[tid] = exp(v - c_val[0]);
        e2[tid] = exp(v / temperature - c_val[0] / temperature);
    }
    barrier();

    // The order-dependent sums, sequentially as the CPU does them.
    if (tid == 0u) {
        float top_p = uintBitsToFloat(s_word[6]);
        float min_p = uintBitsToFloat(s_word[7]);
        float sum1 = 0.0;
        for (uint i = 0u; i < kk; ++i) {
            sum1 += e1[i];
        }
        uint keep = kk;
        if (top_p < 1.0) {
            float cum = 0.0;
            for (uint i = 0u; i < kk; ++i) {
                cum += e1[i] / sum1;
                if (cum >= top_p) {
                    keep = i + 1u;
                    break;
                }
            }
        }
        if (min_p > 0.0) {
            float floor_p = (e1[0] / sum1) * min_p;
            uint above = 0u;
            while (above < kk && e1[above] / sum1 >= floor_p) {
                above += 1u;
            }
            keep = min(keep, max(above, 1u));
        }
        keep = max(keep, 1u);
        float sum2 = 0.0;
        for (uint i = 0u; i < keep; ++i) {
            sum2 += e2[i];
        }
        float u = uniform01(uvec2(s_word[0], s_word[1]), uvec2(s_word[2], s_word[3]));
        uint choice = c_tok[keep - 1u];
        float cum = 0.0;
        for (uint i = 0u; i < keep; ++i) {
            cum += e2[i] / sum2;
            if (u < cum) {
                choice = c_tok[i];
                break;
            }
        }
        s_choice = choice;
    }
    barrier();
    return s_choice;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint row = gl_WorkGroupID.x; // one workgroup per row: its logits, state and output
    row_base = row * pc.n_vocab;
    uint sb = 8u * row;
    if (tid < 8u) {
        s_word[tid] = state[sb + tid];
    }
    barrier();
#ifdef MASKED
    mask_base = row * pc.mask_words + 1u;
    row_masked = pc.mask_words > 0u && maskw[mask_base - 1u] != 0u;
#endif
    lse_on = pc.lp_offset != NO_LOGPROB;
    float temperature = uintBitsToFloat(s_word[4]);
    uint token;
    if (temperature <= 0.0) {
        token = workgroup_argmax(pc.n_vocab);
    } else {
        token = sample_top_k(pc.n_vocab, temperature);
    }
    if (lse_on) {
        workgroup_lse();
    }
#ifdef MASKED
    if (row_masked) {
        // Whether any allowed logit beats -inf: the argmax over the allowed tokens (without
        // the log-sum-exp, which has seen the row already).
        bool lse_was = lse_on;
        lse_on = false;
        uint best = temperature <= 0.0 ? token : workgroup_argmax(pc.n_vocab);
        lse_on = lse_was;
        if (tid == 0u && !(masked(best, logits[row_base + best]) > NEG_INF)) {
            uint first = 0u;
            uint words = (pc.n_vocab + 31u) >> 5u;
            for (uint w = 0u; w < words; ++w) {
                uint bits = maskw[mask_base + w];
                if (bits != 0u) {
                    first = min(32u * w + findLSB(bits), pc.n_vocab - 1u);
                    break;
                }
            }
            token = first;
        }
    }
#endif
    if (tid == 0u) {
        outv[pc.out_offset + row] = token;
        if (lse_on) {
            // The CPU's order of operations: l - max, then - ln(sum).
            float lp = (logits[row_base + token] - s_lse_m) - log(s_lse_s);
            outv[pc.lp_offset + row] = floatBitsToUint(lp);
        }
        uint carry;
        state[sb + 2u] = uaddCarry(s_word[2], 1u, carry);
        state[sb + 3u] = s_word[3] + carry;
    }
}
