#version 450
// Decode attention (few queries per sequence), f32, in ONE dispatch: the same operands and
// semantics as attention.comp (read its header: q, k, v, o, pos layouts, run and table position
// modes, sliding window, n_kv_rows and kv_total bounds, GQA), each query token handled alone.
//
// Workgroup layout: one workgroup per (token t, KV head, chunk of HB of its GQA query heads,
// key piece). The token's visible keys [first, end) are cut into `n_live` pieces of `chunk`
// keys, chunk = max(ceil(len / n_split), min_chunk) (so short contexts take one piece);
// workgroups of pieces past `n_live` exit at once. A workgroup walks its piece in tiles of
// T = WG / LPK keys, one barrier per tile; the K and V rows of the next tile are loaded while
// one tile is computed:
//   scores   clusters of LPK adjacent lanes own one key each: lane c holds dims
//            (r * LPK + c) * 4 .. + 4 of the key (NK4 vec4s) and dots them with the same dims of
//            the HB query rows (held in registers); a log2(LPK)-step xor butterfly finishes
//            each dot product. All keys of a tile are scored at once: no per-key serial chain.
//            The scaled scores go to shared memory (two buffers used in turn).
//   P.V      lanes (d, g), d < NVL = ceil(head_dim_v / 4), g < KG: lane (d, g) owns dims
//            d * 4 .. + 4 of every head's accumulator over the keys g, g + KG, ... of each tile,
//            with its own online softmax: running max m, running sum l, accumulators rescaled
//            by exp(m_old - m_new) once per tile. No cross-lane reduction per tile.
//   merge    at the end the KG key groups of a dim (adjacent lanes of one subgroup) take their
//            common max and add their rescaled (l, acc) with xor shuffles.
// Sinks (has_sinks, gpt-oss): head h's denominator also counts exp(sinks[h] - m), a column with
// no value (llama.cpp's soft_max with sinks), added where the output is normalized.
// One piece: o = acc / l directly. Several pieces: each writes its unnormalized (m, l, acc) to
// `part` ([rows * n_split, NVL * 4] acc (rows padded to vec4s), then [rows * n_split] (m, l)
// pairs, row = t * n_head + h), makes it visible device-wide (memoryBarrierBuffer, barrier),
// then bumps the (t, KV head, head chunk) counter in `cnt` (zero-initialized, per queue); the
// workgroup that sees n_live - 1 (the last one done) merges every piece into o (coherent reads)
// and puts the counter back to 0 for the next replay of the chain. No workgroup ever waits for
// another, so nothing assumes that workgroups run concurrently.
//
// FRESH (variant `attention_decode_fresh`, run mode only): the step's own keys and values are
// not in the cache yet. q is read raw (before its per-head RMSNorm and RoPE), and so are the
// step's keys `kr_raw` and values `vr_raw` ([n_tokens, n_head_kv, head_dim(_v)]); key j of the
// step's positions [p0, p0 + n_tokens) is taken from them (normed with `knw` when qk_norm,
// rotated), every older key from the cache. The workgroup of piece 0, head chunk 0 of (t, KV
// head) also writes token t's rotated key and its value to cache row p0 + t (below n_ctx) through
// the write-only bindings of the same caches; no workgroup reads those rows from the cache in
// this dispatch. This fuses what rms_norm (q, k heads), rope_store and the barriers between them
// did. A workgroup first loads its query heads, the step's keys and values, the RMS weights and
// the host's double-float RoPE frequency table `fq` (as rope_store.comp's) into shared memory (all loads at once), then
// computes the rows' RMS factors and the weighted, rotated rows there (rope.glsl's angle), and
// reads them from there.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_GOOGLE_include_directive : require
#include "kv.glsl"
#include "page.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint LPK = 4;   // lanes per key when scoring (power of two <= subgroup)
layout(constant_id = 2) const uint NK4 = 4;   // vec4s of a q/k row per lane: ceil(head_dim / (4 LPK))
layout(constant_id = 3) const uint NVL = 16;  // lanes per v row: ceil(head_dim_v / 4)
layout(constant_id = 4) const uint HB = 7;    // query heads per workgroup
layout(constant_id = 5) const uint KG = 8;    // key groups of P.V (power of two <= subgroup, KG * NVL <= WG)
layout(constant_id = 6) const bool ALIGNED = true; // head_dim and head_dim_v multiples of 4

const uint WG = gl_WorkGroupSize.x;
const uint T = WG / LPK;              // keys per tile
const uint KPL = (T + KG - 1u) / KG;  // keys per P.V lane per tile
const uint PB = 8;                    // pieces merged per batch of loads
const float NEG_BIG = -1.0e30;        // "nothing seen yet": finite, so exp(NEG_BIG - NEG_BIG) = 1

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { KV_T k[]; };
layout(std430, binding = 2) readonly buffer V { KV_T v[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(std430, binding = 4) readonly buffer P { uint pos[]; };
// coherent: the merging workgroup reads what other workgroups wrote in this dispatch
layout(std430, binding = 5) coherent buffer Part { float part[]; };
layout(std430, binding = 6) coherent buffer Cnt { uint cnt[]; };
layout(std430, binding = 5) coherent buffer Part4 { vec4 part4[]; };
layout(std430, binding = 0) readonly buffer Q4 { vec4 q4[]; };
layout(std430, binding = 1) readonly buffer K4 { KV4_T k4[]; };
layout(std430, binding = 2) readonly buffer V4 { KV4_T v4[]; };
layout(std430, binding = 3) writeonly buffer O4 { vec4 o4[]; };
layout(std430, binding = 7) readonly buffer S { float sinks[]; };
#ifdef FRESH
#include "rope.glsl"
layout(std430, binding = 8) readonly buffer KR { float kr_raw[]; };
layout(std430, binding = 9) readonly buffer VR { float vr_raw[]; };
layout(std430, binding = 10) writeonly buffer KW { KV_T kw[]; };
layout(std430, binding = 11) writeonly buffer VW { KV_T vw[]; };
layout(std430, binding = 12) readonly buffer QNW { float qnw[]; };
layout(std430, binding = 13) readonly buffer KNW { float knw[]; };
layout(std430, binding = 14) readonly buffer FQ { vec2 fq[]; };
const uint MAX_FRESH = 8u;   // tokens of a step (DECODE_MAX_TOKENS)
const uint RW4 = NK4 * LPK;  // vec4s of a staged q/k row (>= head_dim / 4)
const uint RW = RW4 * 4u;    // floats of a staged q/k row
const uint QK_ROWS = HB + MAX_FRESH;
shared float raw_sh[QK_ROWS * RW]; // raw rows: the query heads, then the step's keys up to t
shared float w_sh[2u * RW];  // RMS weights of q, then of k (1 without qk_norm)
shared vec2 fq_sh[RW / 2u];  // frequencies of the pairs (double-float)
shared float inv_q[HB];      // RMS factors of this workgroup's query heads (1 without qk_norm)
shared float inv_k[MAX_FRESH]; // ... and of KV head kvh of the step's tokens
shared vec4 q_sh[HB * RW4];  // the query heads, weighted and rotated (RMS factor not applied)
shared vec4 k_sh[MAX_FRESH * RW4]; // the step's keys of KV head kvh, the same
shared vec4 v_sh[MAX_FRESH * NVL]; // the step's values of KV head kvh
uint fresh0;                 // p0: the step's first position
#endif

layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_head;
    uint n_head_kv;
    uint head_dim;
    uint head_dim_v;
    uint n_kv_rows;
    uint window;
    uint pos_offset;
    float scale;
    uint n_split;   // key pieces (workgroups) per (token, KV head, head chunk)
    uint table;     // 1: per-token (position, block table offset) pairs in pos (page.glsl)
    uint kv_total;  // rows in the k and v buffers
    uint min_chunk; // fewest keys in a piece
    uint has_sinks; // 1: sinks[h] joins head h's softmax denominator
#ifdef FRESH
    uint n_rot;     // rotated dims of a head (pairs as in rope_store.comp)
    uint neox;
    float mscale;   // factor on cos and sin (YaRN)
    uint qk_norm;   // 1: q and k heads are RMS-normed (qnw, knw) before the rotation
    float eps;
    uint n_ctx;     // cache rows written (rows at or past it are not stored)
#endif
} pc;

shared float sc[2 * HB * T]; // scaled scores of a tile, two tiles in turn
shared uint last;            // this workgroup merges
shared float m_sh[HB];       // merge: each head's max over the pieces
shared float l_sh[HB];       // ... and its denominator
shared vec4 red[WG];         // merge: the piece sets' sums

vec4 ld_q(uint base, uint e) {
    if (ALIGNED) {
        return e < pc.head_dim ? q4[(base + e) >> 2] : vec4(0.0);
    }
    vec4 r = vec4(0.0);
    [[unroll]] for (uint i = 0; i < 4u; i++) {
        if (e + i < pc.head_dim) r[i] = q[base + e + i];
    }
    return r;
}

vec4 ld_k(uint base, uint e) {
#ifdef KV_Q8
    return e < pc.head_dim ? q8_ld4(k4, base + e) : vec4(0.0);
#else
    if (ALIGNED) {
        return e < pc.head_dim ? vec4(k4[(base + e) >> 2]) : vec4(0.0);
    }
    vec4 r = vec4(0.0);
    [[unroll]] for (uint i = 0; i < 4u; i++) {
        if (e + i < pc.head_dim) r[i] = float(k[base + e + i]);
    }
    return r;
#endif
}

vec4 ld_v(uint base, uint e) {
#ifdef KV_Q8
    return e < pc.head_dim_v ? q8_ld4(v4, base + e) : vec4(0.0);
#else
    if (ALIGNED) {
        return e < pc.head_dim_v ? vec4(v4[(base + e) >> 2]) : vec4(0.0);
    }
    vec4 r = vec4(0.0);
    [[unroll]] for (uint i = 0; i < 4u; i++) {
        if (e + i < pc.head_dim_v) r[i] = float(v[base + e + i]);
    }
    return r;
#endif
}

// 4 floats of o from element e of row base (zeros past head_dim_v are not written)
void st_o(uint base, uint e, vec4 val) {
    if (ALIGNED) {
        if (e < pc.head_dim_v) o4[(base + e) >> 2] = val;
        return;
    }
    [[unroll]] for (uint i = 0; i < 4u; i++) {
        if (e + i < pc.head_dim_v) o[base + e + i] = val[i];
    }
}

#ifdef FRESH
// dim d of staged row `row` (a query head below HB, else the step's key row - HB) times its RMS
// weight, rotated at the step's position p0 + u (the row's RMS factor is applied by the reader:
// the rotation is linear); the angle is fq * position in double-float (rope.glsl)
float fresh1(uint row, uint u, uint d) {
    uint wb = row < HB ? 0u : RW;
    float x = raw_sh[row * RW + d] * w_sh[wb + d];
    if (d >= pc.n_rot) {
        return x;
    }
    uint half_rot = pc.n_rot / 2u;
    bool neox = pc.neox != 0u;
    uint i = neox ? d % half_rot : d / 2u;
    bool first = neox ? d < half_rot : (d & 1u) == 0u;
    uint dp = neox ? (first ? d + half_rot : d - half_rot) : (d ^ 1u);
    float xp = raw_sh[row * RW + dp] * w_sh[wb + dp];
    vec2 cs = rope_cos_sin(fq_sh[i], fresh0 + u, pc.mscale);
    return first ? x * cs.x - xp * cs.y : xp * cs.y + x * cs.x;
}
#endif

// cache row of key j: j (run mode) or its block's row (table mode: the sequence's block table
// starts at pos[bt]); kv_total for a bad table entry, read as zeros
uint key_row(uint j, uint bt) {
    return pc.table != 0u ? PAGE_ROW(pos, bt, j, pc.kv_total) : j;
}

// elements e .. e + 4 of key j of KV head kvh (cache row key_row(j, bt), or the step's own key)
vec4 ld_key(uint j, uint bt, uint kvh, uint e) {
#ifdef FRESH
    if (j >= fresh0) {
#ifdef KV_Q8
        return k_sh[(j - fresh0) * RW4 + e / 4u]; // normed and rounded in place (3.)
#else
        return kv_round(k_sh[(j - fresh0) * RW4 + e / 4u] * inv_k[j - fresh0]);
#endif
    }
#endif
    uint row = key_row(j, bt);
    if (row >= pc.kv_total) {
        return vec4(0.0);
    }
    return ld_k(row * pc.n_head_kv * pc.head_dim + kvh * pc.head_dim, e);
}

// elements e .. e + 4 of value j of KV head kvh
vec4 ld_val(uint j, uint bt, uint kvh, uint e) {
    uint v_stride = pc.n_head_kv * pc.head_dim_v;
#ifdef FRESH
    if (j >= fresh0) {
        return kv_round(v_sh[(j - fresh0) * NVL + e / 4u]);
    }
#endif
    uint row = key_row(j, bt);
    if (row >= pc.kv_total) {
        return vec4(0.0);
    }
    return ld_v(row * v_stride + kvh * pc.head_dim_v, e);
}

// 1 / the softmax denominator of query head h from its running max m and sum l of exp(s - m):
// l, plus exp(sink - m) with sinks (a column with no value); 0 where nothing is left (no key
// seen and no sink, or a sink so far above every score that exp overflows: the output's limit)
float inv_norm(float l, float m, uint h) {
    float den = l + (pc.has_sinks != 0u ? exp(sinks[h] - m) : 0.0);
    return den > 0.0 ? 1.0 / den : 0.0;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint wid = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint group = pc.n_head / pc.n_head_kv;
    uint n_hc = (group + HB - 1u) / HB;
    uint piece = wid % pc.n_split;
    uint rest = wid / pc.n_split;
    uint hc = rest % n_hc;
    rest /= n_hc;
    uint kvh = rest % pc.n_head_kv;
    uint t = rest / pc.n_head_kv;
    if (t >= pc.n_tokens) {
        return; // grid rounding: whole workgroup
    }
    uint h0 = kvh * group + hc * HB; // first query head
    uint n_h = min(HB, group - hc * HB);
    uint c = tid % LPK;
    // this lane's dims (r * LPK + c) * 4 .. + 4 of the queries (they do not depend on the
    // positions: loaded first); heads past the chunk repeat its last one and are never written
    vec4 qr[HB][NK4];
#ifndef FRESH
    [[unroll]] for (uint h = 0; h < HB; h++) {
        uint qb = (t * pc.n_head + h0 + min(h, n_h - 1u)) * pc.head_dim;
        [[unroll]] for (uint r = 0; r < NK4; r++) {
            qr[h][r] = ld_q(qb, (r * LPK + c) * 4u);
        }
    }
#endif

    // the token's keys [first, end) and this piece's share of them
    uint p = pos[pc.pos_offset] + t;
    uint kbase = 0u; // table mode: where the sequence's block table starts in pos
    if (pc.table != 0u) {
        p = pos[pc.pos_offset + 2u * t];
        kbase = pos[pc.pos_offset + 2u * t + 1u];
    }
    uint first = (pc.window != 0u && p + 1u > pc.window) ? p + 1u - pc.window : 0u;
    uint end = min(p + 1u, pc.n_kv_rows);
    if (pc.table == 0u) {
        end = min(end, pc.kv_total);
    }
    uint len = end > first ? end - first : 0u;
    uint chunk = max((len + pc.n_split - 1u) / pc.n_split, max(pc.min_chunk, 1u));
    uint n_live = max((len + chunk - 1u) / chunk, 1u);
    if (piece >= n_live) {
        return; // whole workgroup
    }
    uint js = first + piece * chunk;
    uint je = max(min(js + chunk, end), js);


    uint kc = tid / LPK; // key of this lane in a tile (scores)
    uint g = tid % KG;   // key group (P.V)
    uint d = tid / KG;   // vec4 of the output dims (P.V)
    float m[HB];  // running max of the scores of this lane's key group
    float l[HB];  // running sum of exp(s - m)
    vec4 acc[HB]; // running sum of exp(s - m) v
    [[unroll]] for (uint h = 0; h < HB; h++) {
        m[h] = NEG_BIG;
        l[h] = 0.0;
        acc[h] = vec4(0.0);
    }

    // tile loads: key j0 + kc's slice for the scores, keys j0 + g + i * KG's V rows for P.V
    // (zeros past the piece); each tile's loads are issued before the previous tile's math
    vec4 kn[NK4];
    vec4 vn[KPL];
#ifndef FRESH
    [[unroll]] for (uint r = 0; r < NK4; r++) {
        kn[r] = vec4(0.0);
        if (js + kc < je) kn[r] = ld_key(js + kc, kbase, kvh, (r * LPK + c) * 4u);
    }
    [[unroll]] for (uint i = 0; i < KPL; i++) {
        uint kk = g + i * KG;
        vn[i] = vec4(0.0);
        if (kk < T && js + kk < je && d < NVL) {
            vn[i] = ld_val(js + kk, kbase, kvh, d * 4u);
        }
    }
#else
    // the first tile's cached keys and values are loaded before the prologue (they do not
    // depend on it); the step's own ones come from shared memory after it
    fresh0 = p - t;
    [[unroll]] for (uint r = 0; r < NK4; r++) {
        kn[r] = vec4(0.0);
        if (js + kc < min(je, fresh0)) kn[r] = ld_key(js + kc, kbase, kvh, (r * LPK + c) * 4u);
    }
    [[unroll]] for (uint i = 0; i < KPL; i++) {
        uint kk = g + i * KG;
        vn[i] = vec4(0.0);
        if (kk < T && js + kk < min(je, fresh0) && d < NVL) {
            vn[i] = ld_val(js + kk, kbase, kvh, d * 4u);
        }
    }
    // 1. every input of the prologue into shared memory, all loads issued at once: the raw
    // query heads and step's keys up to t, the step's values up to t, the RMS weights, the
    // frequencies (zeros past the row widths)
    uint n_qk = (HB + t + 1u) * RW;
    [[unroll]] for (uint i = 0; i < (QK_ROWS * RW + WG - 1u) / WG; i++) {
        uint x = tid + i * WG;
        if (x < n_qk) {
            uint row = x / RW;
            uint e = x % RW;
            float val = 0.0;
            if (e < pc.head_dim) {
                val = row < HB ? q[(t * pc.n_head + h0 + min(row, n_h - 1u)) * pc.head_dim + e]
                               : kr_raw[((row - HB) * pc.n_head_kv + kvh) * pc.head_dim + e];
            }
            raw_sh[x] = val;
        }
    }
    uint v_stride = pc.n_head_kv * pc.head_dim_v;
    [[unroll]] for (uint i = 0; i < (MAX_FRESH * NVL * 4u + WG - 1u) / WG; i++) {
        uint x = tid + i * WG;
        if (x < (t + 1u) * NVL * 4u) {
            uint u = x / (NVL * 4u);
            uint e = x % (NVL * 4u);
            v_sh[u * NVL + e / 4u][e % 4u] =
                e < pc.head_dim_v ? vr_raw[u * v_stride + kvh * pc.head_dim_v + e] : 0.0;
        }
    }
    bool norm = pc.qk_norm != 0u;
    [[unroll]] for (uint i = 0; i < (RW + WG - 1u) / WG; i++) {
        uint x = tid + i * WG;
        if (x < RW) {
            bool in_row = norm && x < pc.head_dim;
            w_sh[x] = in_row ? qnw[x] : 1.0;
            w_sh[RW + x] = in_row ? knw[x] : 1.0;
        }
    }
    uint half_rot = pc.n_rot / 2u;
    [[unroll]] for (uint i = 0; i < (RW / 2u + WG - 1u) / WG; i++) {
        uint x = tid + i * WG;
        if (x < half_rot) {
            fq_sh[x] = fq[x];
        }
    }
    barrier();
    // 2. the RMS factors of the rows (a subgroup per row) and the rows weighted and rotated
    for (uint x = gl_SubgroupID; x < HB + t + 1u; x += gl_NumSubgroups) {
        float ss = 0.0;
        if (norm) {
            for (uint e = gl_SubgroupInvocationID; e < pc.head_dim; e += gl_SubgroupSize) {
                float y = raw_sh[x * RW + e];
                ss += y * y;
            }
            ss = subgroupAdd(ss);
        }
        if (subgroupElect()) {
            float f = norm ? 1.0 / sqrt(ss / float(pc.head_dim) + pc.eps) : 1.0;
            if (x < HB) {
                inv_q[x] = f;
            } else {
                inv_k[x - HB] = f;
            }
        }
    }
    for (uint x = tid; x < n_qk; x += WG) {
        uint row = x / RW;
        uint e = x % RW;
        float val = e < pc.head_dim ? fresh1(row, row < HB ? t : row - HB, e) : 0.0;
        if (row < HB) {
            q_sh[row * RW4 + e / 4u][e % 4u] = val;
        } else {
            k_sh[(row - HB) * RW4 + e / 4u][e % 4u] = val;
        }
    }
    barrier();
    // 3. this lane's query dims, and token t's key and value into the caches
    [[unroll]] for (uint h = 0; h < HB; h++) {
        [[unroll]] for (uint r = 0; r < NK4; r++) {
            qr[h][r] = q_sh[h * RW4 + r * LPK + c] * inv_q[h];
        }
    }
#ifdef KV_Q8
    // the step's keys (RMS factor applied) and values as whole q8_0 blocks: token t's into the
    // caches by one workgroup per (t, KV head), and every row's blocks rounded in shared memory
    // as a later step reads them back (the same arithmetic in every workgroup)
    bool writer = hc == 0u && piece == 0u && p < pc.n_ctx;
    uint kblocks = pc.head_dim / 32u;
    uint vblocks = pc.head_dim_v / 32u;
    for (uint x = tid; x < (t + 1u) * (kblocks + vblocks); x += WG) {
        uint u = x / (kblocks + vblocks);
        uint b = x % (kblocks + vblocks);
        vec4 xs[8];
        uint w[8];
        if (b < kblocks) {
            [[unroll]] for (uint i = 0u; i < 8u; i++) xs[i] = k_sh[u * RW4 + b * 8u + i] * inv_k[u];
            float d16 = q8_quantize(xs, w);
            if (u == t && writer) {
                q8_store_block(kw, (p * pc.n_head_kv + kvh) * kblocks + b, d16, w);
            }
            [[unroll]] for (uint i = 0u; i < 8u; i++) k_sh[u * RW4 + b * 8u + i] = q8_unpack(w[i]) * d16;
        } else {
            b -= kblocks;
            [[unroll]] for (uint i = 0u; i < 8u; i++) xs[i] = v_sh[u * NVL + b * 8u + i];
            float d16 = q8_quantize(xs, w);
            if (u == t && writer) {
                q8_store_block(vw, (p * pc.n_head_kv + kvh) * vblocks + b, d16, w);
            }
            [[unroll]] for (uint i = 0u; i < 8u; i++) v_sh[u * NVL + b * 8u + i] = q8_unpack(w[i]) * d16;
        }
    }
    barrier();
#else
    // token t's rotated key and its value into the caches: one workgroup per (t, KV head)
    if (hc == 0u && piece == 0u && p < pc.n_ctx) {
        uint kd = p * pc.n_head_kv * pc.head_dim + kvh * pc.head_dim;
        for (uint e = tid; e < pc.head_dim; e += WG) {
            kw[kd + e] = kv_store(k_sh[t * RW4 + e / 4u][e % 4u] * inv_k[t]);
        }
        uint vd = p * v_stride + kvh * pc.head_dim_v;
        for (uint e = tid; e < pc.head_dim_v; e += WG) {
            vw[vd + e] = kv_store(v_sh[t * NVL + e / 4u][e % 4u]);
        }
    }
#endif
    [[unroll]] for (uint r = 0; r < NK4; r++) {
        if (js + kc < je && js + kc >= fresh0) kn[r] = ld_key(js + kc, kbase, kvh, (r * LPK + c) * 4u);
    }
    [[unroll]] for (uint i = 0; i < KPL; i++) {
        uint kk = g + i * KG;
        if (kk < T && js + kk < je && js + kk >= fresh0 && d < NVL) {
            vn[i] = ld_val(js + kk, kbase, kvh, d * 4u);
        }
    }
#endif
    uint buf = 0u; // double-buffered scores: one barrier per tile
    for (uint j0 = js; j0 < je; j0 += T) {
        vec4 kr[NK4];
        vec4 vr[KPL];
        [[unroll]] for (uint r = 0; r < NK4; r++) kr[r] = kn[r];
        [[unroll]] for (uint i = 0; i < KPL; i++) vr[i] = vn[i];
        uint j1 = j0 + T; // next tile
        [[unroll]] for (uint r = 0; r < NK4; r++) {
            kn[r] = vec4(0.0);
            if (j1 + kc < je) kn[r] = ld_key(j1 + kc, kbase, kvh, (r * LPK + c) * 4u);
        }
        [[unroll]] for (uint i = 0; i < KPL; i++) {
            uint kk = g + i * KG;
            vn[i] = vec4(0.0);
            if (kk < T && j1 + kk < je && d < NVL) {
                vn[i] = ld_val(j1 + kk, kbase, kvh, d * 4u);
            }
        }
        // scores of key j0 + kc for every head
        bool live = j0 + kc < je;
        float s[HB];
        [[unroll]] for (uint h = 0; h < HB; h++) {
            float dt = 0.0;
            [[unroll]] for (uint r = 0; r < NK4; r++) {
                dt += dot(qr[h][r], kr[r]);
            }
            s[h] = dt;
        }
        [[unroll]] for (uint off = LPK / 2u; off > 0u; off >>= 1) {
            [[unroll]] for (uint h = 0; h < HB; h++) {
                s[h] += subgroupShuffleXor(s[h], off);
            }
        }
        if (c == 0u) {
            [[unroll]] for (uint h = 0; h < HB; h++) {
                sc[(buf * HB + h) * T + kc] = live ? pc.scale * s[h] : NEG_BIG;
            }
        }
        barrier();
        // online softmax over this lane's keys g, g + KG, ... of the tile, then P.V
        [[unroll]] for (uint h = 0; h < HB; h++) {
            float sk[KPL];
            float mx = m[h];
            [[unroll]] for (uint i = 0; i < KPL; i++) {
                uint kk = g + i * KG;
                sk[i] = kk < T ? sc[(buf * HB + h) * T + kk] : NEG_BIG;
                mx = max(mx, sk[i]);
            }
            float alpha = exp(m[h] - mx);
            m[h] = mx;
            float lh = l[h] * alpha;
            vec4 ah = acc[h] * alpha;
            [[unroll]] for (uint i = 0; i < KPL; i++) {
                uint kk = g + i * KG;
                float pj = (kk < T && j0 + kk < je) ? exp(sk[i] - mx) : 0.0;
                lh += pj;
                ah += pj * vr[i];
            }
            l[h] = lh;
            acc[h] = ah;
        }
        buf ^= 1u; // the next tile writes the other half: this one is read until its barrier
    }
    // merge the key groups (adjacent lanes of one subgroup): common max, then sums
    [[unroll]] for (uint h = 0; h < HB; h++) {
        float mx = m[h];
        [[unroll]] for (uint off = KG / 2u; off > 0u; off >>= 1) {
            mx = max(mx, subgroupShuffleXor(mx, off));
        }
        float f = exp(m[h] - mx);
        m[h] = mx;
        l[h] *= f;
        acc[h] *= f;
    }
    [[unroll]] for (uint off = KG / 2u; off > 0u; off >>= 1) {
        [[unroll]] for (uint h = 0; h < HB; h++) {
            l[h] += subgroupShuffleXor(l[h], off);
            acc[h] += subgroupShuffleXor(acc[h], off);
        }
    }
    bool owner = g == 0u && d < NVL; // holds output dims d * 4 .. + 4
    uint hv = pc.head_dim_v;
    if (n_live == 1u) {
        if (owner) {
            [[unroll]] for (uint h = 0; h < HB; h++) {
                if (h < n_h) {
                    float f = inv_norm(l[h], m[h], h0 + h);
                    st_o((t * pc.n_head + h0 + h) * hv, d * 4u, acc[h] * f);
                }
            }
        }
        return;
    }

    // several pieces: the partial result, then the last workgroup done merges
    uint rows = pc.n_tokens * pc.n_head;
    uint ml0 = rows * pc.n_split * NVL * 4u; // start of the (m, l) pairs
    [[unroll]] for (uint h = 0; h < HB; h++) {
        if (h >= n_h) continue;
        uint slot = (t * pc.n_head + h0 + h) * pc.n_split + piece;
        if (owner) {
            part4[slot * NVL + d] = acc[h];
        }
        if (tid == 0u) {
            part[ml0 + 2u * slot] = m[h];
            part[ml0 + 2u * slot + 1u] = l[h];
        }
    }
    memoryBarrierBuffer();
    barrier();
    uint ci = (t * pc.n_head_kv + kvh) * n_hc + hc;
    if (tid == 0u) {
        last = atomicAdd(cnt[ci], 1u) == n_live - 1u ? 1u : 0u;
    }
    barrier();
    if (last == 0u) {
        return; // whole workgroup
    }
    memoryBarrierBuffer();
    if (tid == 0u) {
        atomicExchange(cnt[ci], 0u); // every piece has counted: ready for the next replay
    }
    // per head, the common max M and the denominator over the pieces: a subgroup per head
    for (uint h = gl_SubgroupID; h < n_h; h += gl_NumSubgroups) {
        uint slot0 = (t * pc.n_head + h0 + h) * pc.n_split;
        float mx = NEG_BIG;
        for (uint s = gl_SubgroupInvocationID; s < n_live; s += gl_SubgroupSize) {
            mx = max(mx, part[ml0 + 2u * (slot0 + s)]);
        }
        mx = subgroupMax(mx);
        float ls = 0.0;
        for (uint s = gl_SubgroupInvocationID; s < n_live; s += gl_SubgroupSize) {
            ls += exp(part[ml0 + 2u * (slot0 + s)] - mx) * part[ml0 + 2u * (slot0 + s) + 1u];
        }
        ls = subgroupAdd(ls);
        if (subgroupElect()) {
            m_sh[h] = mx;
            l_sh[h] = ls;
        }
    }
    barrier();
    // lane (set, x): vec4 x % NVL of head x / NVL summed over the pieces set, set + sets, ...
    // (every lane of the workgroup busy), PB loads issued at once (clamped indices: no
    // branch); then the sets are added in shared memory
    uint lanes = n_h * NVL;
    uint sets = max(WG / lanes, 1u);
    for (uint x0 = 0u; x0 < lanes; x0 += WG) { // several passes only when lanes > WG (sets = 1)
        uint set = tid / lanes;
        uint x = x0 + tid % lanes;
        vec4 a = vec4(0.0);
        if (set < sets && x < lanes) {
            uint h = x / NVL;
            uint dv = x % NVL;
            uint slot0 = (t * pc.n_head + h0 + h) * pc.n_split;
            float mx = m_sh[h];
            for (uint s0 = set; s0 < n_live; s0 += sets * PB) {
                vec4 av[PB];
                float mv[PB];
                [[unroll]] for (uint i = 0; i < PB; i++) {
                    uint slot = slot0 + min(s0 + i * sets, n_live - 1u);
                    av[i] = part4[slot * NVL + dv];
                    mv[i] = part[ml0 + 2u * slot];
                }
                [[unroll]] for (uint i = 0; i < PB; i++) {
                    a += s0 + i * sets < n_live ? exp(mv[i] - mx) * av[i] : vec4(0.0);
                }
            }
        }
        red[tid] = a;
        barrier();
        if (x < lanes && set == 0u) {
            uint h = x / NVL;
            for (uint i = 1u; i < sets; i++) {
                a += red[tid + i * lanes];
            }
            st_o((t * pc.n_head + h0 + h) * hv, (x % NVL) * 4u, a * inv_norm(l_sh[h], m_sh[h], h0 + h));
        }
        barrier();
    }
}
