// The pieces of the 8-bit integer dot products shared by matvec_dot.comp and moe_dot.comp:
// x quantized per block of 32 values as llama.cpp's q8_1, reads of weight words at 2-byte or
// any byte alignment, and the blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4) decoded into
// 8-bit codes four to a word.
//
// The includer defines `uint word(uint m, uint i)` (word i of matrix m: 0 the weights, 1 a
// GLU's up matrix) and, for Q4_K and Q5_K, `uvec4 vec4_at(uint m, uint i)`; declares `shared
// uint xq[]` (x's codes, four to a word, lowest byte first) and `shared vec2 xs[]` (per block of
// x: d and d times the sum of its codes); and defines at most one DOT_<TYPE>. Each type's
// decoder reads a lane's share of a block once; its `*_dot` function then takes that share
// against one row of x's codes (a token, or an expert pair), so a decoded weight serves every
// row of x a workgroup holds.
//
// K-quants: eight lanes share a super-block. Q4_K (144 bytes: a 16-byte head with d, dmin and
// the twelve 6-bit scale/min bytes, then 128 code bytes): lane (p, h) of the eight reads code
// bytes [32p + 16h, + 16) — the low nibbles are elements 64p + 16h + i of sub-block 2p, the high
// ones 64p + 32 + 16h + i of sub-block 2p + 1 — so the eight lanes read the block's codes as 128
// contiguous bytes; the min term (dmin * min * sum of x) of both sub-blocks is added by the h = 0
// lane from the blocks' sums. Q5_K: the same lanes and head (176-byte super-blocks: head, qh[32],
// then the codes at byte 48); each code's fifth bit is bit 2p (low nibbles) or 2p + 1 (high) of
// qh[i] for the code's byte i of its 32-byte window, so a lane also reads qh's 16 bytes
// [16h, 16h + 16). Q6_K: 210 bytes — ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8
// scales, the f16 d — at 2-byte alignment; lane (n, c) of the eight takes bytes [8c, 8c + 8) of
// half n's ql windows and qh: element 128n + 32g + 8c + i (g < 4) is code (ql[64n + 32(g % 2) +
// 8c + i] >> 4(g / 2)) | ((qh[32n + 8c + i] >> 2g) & 3) << 4, minus 32, under scale 8n + 2g +
// c / 2. The codes enter the dot unsigned (0..63) and 32 times the sum of x's codes (a dot with
// 0x01010101) comes off.
//
// Blocks of 32: a block's codes come as eight words, element 4j + i in byte i of word j. Q8_0's
// codes are signed and meet x's as they are; the 4- and 5-bit codes enter unsigned (byte i of
// the 16 code bytes holds elements i and i + 16 in its nibbles, Q5's fifth bit is bit e of qh),
// and their offset (8 or 16 times the block's sum of x) or their minimum (m times it) is
// applied through x's block sums. Q4_0, Q5_0 and Q8_0 blocks (18, 22, 34 bytes) sit at 2-byte
// alignment; MXFP4's (17 bytes: the E8M0 exponent, then the codes as Q4_0's) at any byte, read
// as five words and realigned by funnel shifts. MXFP4's E2M1 codes become signed 8-bit values
// of ggml's doubled code book (0, 1, 2, 3, 4, 6, 8, 12 and their negatives) four at a time in
// a word (`e2m1_codes`), under half the block's power-of-two scale.

#include "q8.glsl"
#include "kscales.glsl"

// the word at byte b (b even) of matrix m: blocks of 2-byte alignment
uint wd(uint m, uint b) {
    uint i = b >> 2;
    return (b & 2u) == 0u ? word(m, i) : (word(m, i) >> 16) | (word(m, i + 1u) << 16);
}

// the f16 at byte b (b even) of matrix m
float half_at(uint m, uint b) {
    vec2 v = unpackHalf2x16(word(m, b >> 2));
    return (b & 2u) == 0u ? v.x : v.y;
}

#if defined(DOT_Q4_0) || defined(DOT_Q4_1) || defined(DOT_Q5_0) || defined(DOT_Q5_1) || defined(DOT_Q8_0) || defined(DOT_MXFP4)
#define BLOCK32
#if defined(DOT_Q4_0)
const uint BB = 18u; // bytes a block
#elif defined(DOT_Q4_1)
const uint BB = 20u;
#elif defined(DOT_Q5_0)
const uint BB = 22u;
#elif defined(DOT_Q5_1)
const uint BB = 24u;
#elif defined(DOT_MXFP4)
const uint BB = 17u;
#else
const uint BB = 34u;
#endif

// bits 0..3 of b as bit 4 of bytes 0..3 (Q5's fifth bits of four codes)
uint spread4(uint b) {
    return ((b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21)) << 4;
}

// four E2M1 codes (one a byte: sign bit 3, exponent and mantissa bits 0..2 = em) as signed
// 8-bit values of the doubled code book: em for em < 4, em + (em & 3) for em >= 4, and 2 more
// for em = 7 (4, 6, 8, 12); negated where the sign is set and the value is not zero (so that
// no byte borrows from the next)
uint e2m1_codes(uint n) {
    uint em = n & 0x07070707u;
    uint b2 = (em >> 2) & 0x01010101u;
    uint v = em + (em & (b2 * 3u)) + ((em & (em >> 1) & b2) << 1);
    uint neg = (n >> 3) & (em | (em >> 1) | (em >> 2)) & 0x01010101u;
    return (v ^ (neg * 0xFFu)) + neg;
}

// the block at byte `at` of matrix m: its codes as eight words (element 4j + i in byte i of
// word j); returns (d, m), m the minimum of Q4_1 and Q5_1 (MXFP4: a second factor of d; else 0)
vec2 b32_decode(uint m, uint at, out uint cw[8]) {
#if defined(DOT_Q8_0)
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        cw[j] = wd(m, at + 2u + 4u * j);
    }
    return vec2(half_at(m, at), 0.0);
#elif defined(DOT_MXFP4)
    uint i0 = at >> 2;
    uint o = at & 3u;
    uint raw[5];
    [[unroll]] for (uint k = 0u; k < 5u; k++) {
        raw[k] = word(m, i0 + k); // the block's last byte is in word i0 + 4 whatever o is
    }
    uint e8 = byte_of(raw[0], o);
    // code word j is the four bytes from o + 1 + 4j: raw[j + 1] when o = 3, else a funnel (sh
    // clamped so that the unused one at o = 3 shifts by less than 32)
    uint sh = 8u * min(o + 1u, 3u);
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint q = o == 3u ? raw[j + 1u] : (raw[j] >> sh) | (raw[j + 1u] << (32u - sh));
        cw[j] = e2m1_codes(q & 0x0F0F0F0Fu);
        cw[j + 4u] = e2m1_codes((q >> 4) & 0x0F0F0F0Fu);
    }
    // 2^(e - 128), half the E8M0 scale; for e < 2 (an f32 subnormal, which a device may flush
    // as an operand) 2^-64 and then 2^(e - 64)
    return e8 < 2u ? vec2(uintBitsToFloat(63u << 23), uintBitsToFloat((e8 + 63u) << 23))
                   : vec2(uintBitsToFloat((e8 - 1u) << 23), 1.0);
#else
#if defined(DOT_Q4_1) || defined(DOT_Q5_1)
    vec2 dm = unpackHalf2x16(word(m, at >> 2)); // 20- and 24-byte blocks: word aligned
#else
    vec2 dm = vec2(half_at(m, at), 0.0);
#endif
#if defined(DOT_Q4_0)
    uint qs = at + 2u;
#elif defined(DOT_Q4_1)
    uint qs = at + 4u;
#elif defined(DOT_Q5_0)
    uint qh = wd(m, at + 2u);
    uint qs = at + 6u;
#else
    uint qh = word(m, (at + 4u) >> 2);
    uint qs = at + 8u;
#endif
    [[unroll]] for (uint j = 0u; j < 4u; j++) {
        uint q = wd(m, qs + 4u * j);
        cw[j] = q & 0x0F0F0F0Fu;
        cw[j + 4u] = (q >> 4) & 0x0F0F0F0Fu;
#if defined(DOT_Q5_0) || defined(DOT_Q5_1)
        cw[j] |= spread4(qh >> (4u * j));
        cw[j + 4u] |= spread4(qh >> (16u + 4u * j));
#endif
    }
    return dm;
#endif
}

// a block's contribution from its codes' dot `id` with x's block (xv: d, d * sum of codes)
float b32_apply(vec2 dm, int id, vec2 xv) {
#if defined(DOT_Q8_0)
    return dm.x * xv.x * float(id);
#elif defined(DOT_MXFP4)
    return dm.x * xv.x * float(id) * dm.y;
#elif defined(DOT_Q4_0)
    return dm.x * (xv.x * float(id) - 8.0 * xv.y);
#elif defined(DOT_Q5_0)
    return dm.x * (xv.x * float(id) - 16.0 * xv.y);
#else
    return dm.x * xv.x * float(id) + dm.y * xv.y;
#endif
}

// a block's decoded codes (b32_decode's dm, cw) against one row of x's codes: its words from
// xw, its block xb
float b32_dot(vec2 dm, uint cw[8], uint xw, uint xb) {
    int id = 0;
    [[unroll]] for (uint c = 0u; c < 8u; c++) {
        id += dotPacked4x8EXT(int(cw[c]), int(xq[xw + c]));
    }
    return b32_apply(dm, id, xs[xb]);
}
#endif

#if defined(DOT_Q4_K) || defined(DOT_Q5_K)
#define KQUANT
#ifdef DOT_Q5_K
const uint SB_VECS = 11u; // uvec4s a super-block
const uint QS_VEC = 3u;   // where its codes start
#else
const uint SB_VECS = 9u;
const uint QS_VEC = 1u;
#endif

// lane (p, h)'s codes of the super-block at uvec4 `at` of matrix m: the low nibbles (sub-block
// 2p) in lo, the high ones (2p + 1) in hi; returns the factors of the two sub-blocks' code dots
// (d * scale) and of their x sums (dmin * min; zero on the h = 1 lane, which leaves them)
vec4 kq_decode(uint m, uint at, uint p, uint h, out uint lo[4], out uint hi[4]) {
    uvec4 hd = vec4_at(m, at);
    uvec4 qs = vec4_at(m, at + QS_VEC + 2u * p + h);
#ifdef DOT_Q5_K
    uvec4 qh = vec4_at(m, at + 1u + h);
#endif
    uvec2 sc;
    uvec2 mn;
    kq_pair_scales(hd.yzw, p, sc, mn);
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        lo[i] = qs[i] & 0x0F0F0F0Fu;
        hi[i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
#ifdef DOT_Q5_K
        lo[i] |= ((qh[i] >> (2u * p)) & 0x01010101u) << 4;
        hi[i] |= ((qh[i] >> (2u * p + 1u)) & 0x01010101u) << 4;
#endif
    }
    vec2 dm = unpackHalf2x16(hd.x);
    float keep = h == 0u ? dm.y : 0.0;
    return vec4(dm.x * float(sc.x), dm.x * float(sc.y), keep * float(mn.x), keep * float(mn.y));
}

// a lane's decoded share (kq_decode's f, lo, hi) against one row of x's codes: its words from
// xw (the low sub-block's; the high one's 8 words on), its blocks xb and xb + 1
float kq_dot(vec4 f, uint lo[4], uint hi[4], uint xw, uint xb) {
    int il = 0;
    int ih = 0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        il += dotPacked4x8EXT(int(lo[i]), int(xq[xw + i]));
        ih += dotPacked4x8EXT(int(hi[i]), int(xq[xw + 8u + i]));
    }
    vec2 xl = xs[xb];
    vec2 xh = xs[xb + 1u];
    return f.x * xl.x * float(il) + f.y * xh.x * float(ih) - (f.z * xl.y + f.w * xh.y);
}
#endif

#ifdef DOT_Q6_K
// lane (n, c)'s codes of the super-block at byte `at` of matrix m: for each g < 4 two words
// cw[2g], cw[2g + 1] (unsigned, 0..63) under scale sc[g]; returns d
float q6_decode(uint m, uint at, uint n, uint c, out uint cw[8], out int sc[4]) {
    uint la = at + 64u * n + 8u * c; // ql, g = 0 and 2
    uint lb = la + 32u;               // ql, g = 1 and 3
    uint hb = at + 128u + 32u * n + 8u * c;
    uvec2 qa = uvec2(wd(m, la), wd(m, la + 4u));
    uvec2 qb = uvec2(wd(m, lb), wd(m, lb + 4u));
    uvec2 qh = uvec2(wd(m, hb), wd(m, hb + 4u));
    uvec2 sw = uvec2(wd(m, at + 192u + 8u * n), wd(m, at + 196u + 8u * n)); // scales 8n ..
    uint is = c / 2u;
    [[unroll]] for (uint g = 0u; g < 4u; g++) {
        [[unroll]] for (uint k = 0u; k < 2u; k++) {
            uint lo = g % 2u == 0u ? qa[k] : qb[k];
            cw[2u * g + k] = ((lo >> (4u * (g / 2u))) & 0x0F0F0F0Fu) |
                             (((qh[k] >> (2u * g)) & 0x03030303u) << 4);
        }
        uint si = is + 2u * g; // scale 8n + is + 2g: byte si of the two words
        sc[g] = bitfieldExtract(int(sw[si / 4u]), int(8u * (si % 4u)), 8);
    }
    return half_at(m, at + 208u);
}

// a lane (n, c)'s decoded share (q6_decode's cw, sc) against one row of x's codes (its words
// from xw0, its blocks from xb0): the super-block's blocks b0 .. b0 + 3 (b0 = 8 sb + 4n); times
// d by the caller
float q6_dot(uint cw[8], int sc[4], uint xw0, uint xb0, uint b0, uint c) {
    float s = 0.0;
    [[unroll]] for (uint g = 0u; g < 4u; g++) {
        uint b = b0 + g;
        uint xw = xw0 + b * 8u + 2u * c;
        int isum = 0;
        int xsum = 0;
        [[unroll]] for (uint i = 0u; i < 2u; i++) {
            int xv = int(xq[xw + i]);
            isum += dotPacked4x8EXT(int(cw[2u * g + i]), xv);
            xsum += dotPacked4x8EXT(0x01010101, xv);
        }
        s += float(sc[g]) * xs[xb0 + b].x * float(isum - 32 * xsum);
    }
    return s;
}
#endif

