// The pieces of the 8-bit integer dot products shared by matvec_dot.comp and moe_dot.comp:
// x quantized per block of 32 values as llama.cpp's q8_1, reads of weight words at 2-byte or
// any byte alignment, and the blocks of 32 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4) decoded into
// 8-bit codes four to a word.
//
// The includer defines `uint word(uint m, uint i)` (word i of matrix m: 0 the weights, 1 a
// GLU's up matrix), declares `shared uint xq[]` (x's codes, four to a word, lowest byte first)
// and defines at most one DOT_<TYPE>.
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

// half away from zero, as llama.cpp's roundf (the reference computes it the same way)
float round_away(float v) {
    return sign(v) * floor(abs(v) + 0.5);
}

uint byte_at(uint u, uint k) {
    return (u >> (8u * k)) & 0xFFu;
}

// q8 codes of one block of 32 values v (v[j] elements 4j .. 4j + 3) into xq[o .. o + 8);
// returns (d, d * sum of the codes), d = max|v| / 127
vec2 q8_store(vec4 v[8], uint o) {
    float amax = 0.0;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        vec4 a = abs(v[j]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    float d = amax / 127.0;
    float id = d > 0.0 ? 1.0 / d : 0.0;
    int sum = 0;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        ivec4 q = ivec4(round_away(v[j].x * id), round_away(v[j].y * id),
                        round_away(v[j].z * id), round_away(v[j].w * id));
        sum += q.x + q.y + q.z + q.w;
        xq[o + j] = uint(q.x & 0xFF) | (uint(q.y & 0xFF) << 8) | (uint(q.z & 0xFF) << 16) |
                    (uint(q.w & 0xFF) << 24);
    }
    return vec2(d, d * float(sum));
}

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
    uint e8 = byte_at(raw[0], o);
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
#endif
