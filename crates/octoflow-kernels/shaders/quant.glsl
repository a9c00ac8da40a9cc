// Reading GGUF-encoded weight rows from a `uint` word array: per weight type, the dequantization
// of one 32-element chunk of a row — the unit every quantized kernel uses — in two halves:
//
//   chunk_fetch(row_byte, c, n, raw)     only the global loads: the QRAW words the chunk needs
//   chunk_decode(raw, row_byte, c, n, v) only arithmetic on those words: the 32 values
//
// dequant_chunk(row_byte, c, n, v) is the two in a row. A kernel that wants the loads of its next
// chunk in flight while it computes (matmul_coop.comp) calls the halves apart, keeping raw in
// registers in between.
//
// Before including this file a shader defines exactly one QTYPE_* (QTYPE_F32, QTYPE_F16,
// QTYPE_BF16, QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q8_0, QTYPE_MXFP4,
// QTYPE_IQ4_NL, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_XS) and
// declares the weights as a buffer with the member `uint w[];` (32-bit words of the
// little-endian GGUF bytes). A row of n elements starts at byte `row_byte` (row r of a matrix:
// r * row_bytes, row_bytes = quantized_size(type, n)). Blocks of Q4_0, Q5_0, Q8_0, IQ4_NL,
// Q3_K, Q6_K and rows of F16/BF16 are only 2-byte aligned: their fields are read as windows of
// whole words (the words holding the region, from word b >> 2) and picked apart at decode time
// with the bit (b & 2), which chunk_decode recomputes from row_byte and c. MXFP4's 17-byte
// blocks start at any byte: its five words are realigned by funnel shifts at decode time. Every
// load is of a word holding a byte of the chunk's block (of the chunk's real elements for
// F32/F16/BF16), so nothing is read past the end of a buffer of whole words.
//
// Chunk c of a row holds elements [32c, 32c + 32). For the 32-element block types (legacy,
// MXFP4, IQ4_NL) it is block c; for the 256-element super-blocks (K-quants, IQ4_XS) it is
// sub-chunk c % 8 of super-block c / 8. For F32/F16/BF16 the last chunk may be partial (n not a
// multiple of 32): chunk_fetch loads only its real elements, chunk_decode zero-fills past n and
// chunk_len() says how many are real.
//
// Products are formed as the CPU codecs form them (scale times code, minus the min last).
//
// A shader that reads a second matrix of the same type (matvec.comp's GLU variants: the up
// matrix next to the gate matrix) includes this file again with QSECOND defined: that copy reads
// the buffer member `uint w2[]` and every function in it carries the suffix _2 (dequant_chunk_2,
// ...); the layout constants and macros are defined again, identically.
#ifdef QSECOND
#define w w2
#define qmad qmad_2
#define chunk_count chunk_count_2
#define chunk_len chunk_len_2
#define chunk_fetch chunk_fetch_2
#define chunk_decode chunk_decode_2
#define dequant_chunk dequant_chunk_2
#endif

// QCPU (defined by the CPU-driver shader) implies QWINDOW; QWINDOW alone (matvec, the
// tensor-core matmul) unrolls the constant-trip loops below, so the raw words live in registers
// and all of a chunk's loads can be in flight at once. Both decode identically: the code is the
// same, branch-free on the data, with or without the unrolling.
#ifdef QCPU
#define QWINDOW 1
#endif
#ifdef QWINDOW
#define QUNROLL [[unroll]]
#else
#define QUNROLL
#endif

#include "kscales.glsl"

// Windows of words: a 2-byte aligned region at byte b is held as the whole words raw[..] from
// word (b >> 2), h = (b & 2) != 0; then the u32 / u16 at even region offset o (a constant, so
// the word indices are constants):
#define QFUNNEL(a, b) (((a) >> 16) | ((b) << 16))
#define WIN_U32(raw, o, h) ((((o) & 2u) != 0u) \
    ? ((h) ? raw[((o) >> 2) + 1u] : QFUNNEL(raw[(o) >> 2], raw[((o) >> 2) + 1u])) \
    : ((h) ? QFUNNEL(raw[(o) >> 2], raw[((o) >> 2) + 1u]) : raw[(o) >> 2]))
#define WIN_U16(raw, o, h) ((((o) & 2u) != 0u) \
    ? ((h) ? (raw[((o) >> 2) + 1u] & 0xFFFFu) : (raw[(o) >> 2] >> 16)) \
    : ((h) ? (raw[(o) >> 2] >> 16) : (raw[(o) >> 2] & 0xFFFFu)))
// The low / high (hi: a bool) u16 of word u, and the IEEE f16 there as f32.
#define HALF_BITS(u, hi) ((hi) ? ((u) >> 16) : ((u) & 0xFFFFu))
#define HALF_OF(u, hi) unpackHalf2x16(HALF_BITS(u, hi)).x
// Entry q (0..15) of a 16-entry table of i8 packed little-endian into the words t0..t3: selects,
// not an indexed array, so the code book stays in immediates and the lookup is branch-free.
#define QKV_PICK(t0, t1, t2, t3, q) bitfieldExtract(int((q) < 8u ? ((q) < 4u ? (t0) : (t1)) \
    : ((q) < 12u ? (t2) : (t3))), int(8u * ((q) & 3u)), 8)
// ggml's kvalues_iq4nl {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
#define IQ4NL_VALUE(q) QKV_PICK(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u, q)

// a * b + c rounded twice, as the CPU codecs compute it: `precise` forbids the fused
// multiply-add, so decoded weights agree bit for bit with `octoflow_gguf::quant::dequantize`
// (kernels that round them further, to f16, then round the same values).
float qmad(float a, float b, float c) {
    precise float r = a * b + c;
    return r;
}

// ---- per-type layout constants --------------------------------------------------------------
// QK: elements per block; QBYTES: bytes per block; QDENSE: a float type (block of one element);
// QRAW: the words chunk_fetch loads per chunk.

#if defined(QTYPE_F32)
#define QK 1u
#define QBYTES 4u
#define QDENSE 1
#define QRAW 32u // the 32 elements (4-byte aligned)
#elif defined(QTYPE_F16) || defined(QTYPE_BF16)
#define QK 1u
#define QBYTES 2u
#define QDENSE 1
#define QRAW 17u // 64 bytes at an even offset
#elif defined(QTYPE_Q4_0)
#define QK 32u
#define QBYTES 18u
#define QRAW 5u // [d:2][qs:16] at an even offset
#elif defined(QTYPE_Q4_1)
#define QK 32u
#define QBYTES 20u
#define QRAW 5u // [d:2][m:2][qs:16], 4-byte aligned
#elif defined(QTYPE_Q5_0)
#define QK 32u
#define QBYTES 22u
#define QRAW 6u // [d:2][qh:4][qs:16] at an even offset
#elif defined(QTYPE_Q5_1)
#define QK 32u
#define QBYTES 24u
#define QRAW 6u // [d:2][m:2][qh:4][qs:16], 4-byte aligned
#elif defined(QTYPE_Q8_0)
#define QK 32u
#define QBYTES 34u
#define QRAW 9u // [d:2][qs:32] at an even offset
#elif defined(QTYPE_MXFP4)
#define QK 32u
#define QBYTES 17u
#define QRAW 5u // [e:1][qs:16] at any offset
#elif defined(QTYPE_IQ4_NL)
#define QK 32u
#define QBYTES 18u
#define QRAW 5u // [d:2][qs:16] at an even offset
#elif defined(QTYPE_Q2_K)
#define QK 256u
#define QBYTES 84u
#define QRAW 10u // the sub-block's 32 qs bytes, its scale pair's word, the (d, dmin) word
#elif defined(QTYPE_Q3_K)
#define QK 256u
#define QBYTES 110u
#define QRAW 22u // hmask and qs windows (9 words each), the window of scales and d (4 words)
#elif defined(QTYPE_Q4_K)
#define QK 256u
#define QBYTES 144u
#define QRAW 12u // [d:2][dmin:2], the 12 scale bytes, the sub-block's 32 qs bytes
#elif defined(QTYPE_Q5_K)
#define QK 256u
#define QBYTES 176u
#define QRAW 20u // as Q4_K plus the 32 qh bytes
#elif defined(QTYPE_Q6_K)
#define QK 256u
#define QBYTES 210u
#define QRAW 20u // ql and qh windows (9 words each), the scale pair's word, d's word
#elif defined(QTYPE_IQ4_XS)
#define QK 256u
#define QBYTES 136u
#define QRAW 6u // [d:2][scales_h:2], scales_l, the sub-block's 16 qs bytes
#else
#error "quant.glsl: define one QTYPE_*"
#endif

// Chunks in a row of n elements.
uint chunk_count(uint n) {
    return (n + 31u) / 32u;
}

// Real elements in chunk c of a row of n elements (32 except a partial last F32/F16 chunk).
uint chunk_len(uint c, uint n) {
#ifdef QDENSE
    return min(32u, n - 32u * c);
#else
    return 32u;
#endif
}

// ---- the chunk dequantizer --------------------------------------------------------------------

// raw = the words chunk c (< chunk_count(n)) of the row of n elements at byte row_byte decodes
// from; loads only, no arithmetic on their values (F32/F16: words past the row's end are 0).
void chunk_fetch(uint row_byte, uint c, uint n, out uint raw[QRAW]) {
#if defined(QTYPE_F32)
    uint i0 = (row_byte >> 2) + 32u * c;
    uint len = chunk_len(c, n);
    QUNROLL for (uint k = 0u; k < QRAW; k++) {
        raw[k] = k < len ? w[i0 + k] : 0u;
    }
#elif defined(QTYPE_F16) || defined(QTYPE_BF16)
    uint b = row_byte + 64u * c;
    uint i0 = b >> 2;
    uint last = ((b & 2u) + 2u * chunk_len(c, n) - 1u) >> 2; // the word of the last real byte
    QUNROLL for (uint k = 0u; k < QRAW; k++) {
        raw[k] = k <= last ? w[i0 + k] : 0u;
    }
#elif defined(QTYPE_Q4_K) || defined(QTYPE_Q5_K)
    // [d:2][dmin:2][scales:12]([qh:32] for Q5_K)[qs:128]: words 0..3 (d, dmin, scales),
    // (Q5_K: words 4..11, qh,) then the 32 qs bytes of sub-block j = c % 8 at 32 * (j / 2).
    uint i0 = (row_byte + (c / 8u) * QBYTES) >> 2;
    uint j = c % 8u;
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        raw[k] = w[i0 + k];
    }
#ifdef QTYPE_Q5_K
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        raw[4u + k] = w[i0 + 4u + k];
    }
    uint qs = i0 + 12u + 8u * (j / 2u);
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        raw[12u + k] = w[qs + k];
    }
#else
    uint qs = i0 + 4u + 8u * (j / 2u);
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        raw[4u + k] = w[qs + k];
    }
#endif
#elif defined(QTYPE_Q6_K)
    // [ql:128][qh:64][scales:16 x i8][d:2]: raw[0..9) the window of the 32 ql bytes of
    // sub-chunk j = c % 8, raw[9..18) that of its 32 qh bytes, raw[18] the word holding its two
    // scales, raw[19] the word holding d.
    uint bb = row_byte + (c / 8u) * QBYTES;
    uint j = c % 8u;
    uint lo = bb + 64u * (j / 4u) + 32u * (j % 2u);
    uint hi = bb + 128u + 32u * (j / 4u);
    QUNROLL for (uint k = 0u; k < 9u; k++) {
        raw[k] = w[(lo >> 2) + k];
        raw[9u + k] = w[(hi >> 2) + k];
    }
    raw[18] = w[(bb + 192u + 2u * j) >> 2];
    raw[19] = w[(bb + 208u) >> 2];
#elif defined(QTYPE_Q2_K)
    // [scales:16][qs:64][d:2][dmin:2], 4-byte aligned: the 32 qs bytes of sub-chunk j = c % 8
    // at 16 + 32 * (j / 4), the word of scales 2j and 2j + 1, the word of d and dmin.
    uint i0 = (row_byte + (c / 8u) * QBYTES) >> 2;
    uint j = c % 8u;
    uint qs = i0 + 4u + 8u * (j / 4u);
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        raw[k] = w[qs + k];
    }
    raw[8] = w[i0 + j / 2u];
    raw[9] = w[i0 + 20u];
#elif defined(QTYPE_Q3_K)
    // [hmask:32][qs:64][scales:12][d:2] at an even offset: raw[0..9) the window of the 32 hmask
    // bytes, raw[9..18) that of the 32 qs bytes of sub-chunk j = c % 8 at 32 + 32 * (j / 4),
    // raw[18..22) that of the scales and d (bytes 96..110).
    uint bb = row_byte + (c / 8u) * QBYTES;
    uint j = c % 8u;
    uint qs = bb + 32u + 32u * (j / 4u);
    QUNROLL for (uint k = 0u; k < 9u; k++) {
        raw[k] = w[(bb >> 2) + k];
        raw[9u + k] = w[(qs >> 2) + k];
    }
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        raw[18u + k] = w[((bb + 96u) >> 2) + k];
    }
#elif defined(QTYPE_IQ4_XS)
    // [d:2][scales_h:2][scales_l:4][qs:128], 4-byte aligned: words 0 and 1, then the 16 qs
    // bytes of sub-block j = c % 8 at 8 + 16 * j.
    uint i0 = (row_byte + (c / 8u) * QBYTES) >> 2;
    uint j = c % 8u;
    raw[0] = w[i0];
    raw[1] = w[i0 + 1u];
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        raw[2u + k] = w[i0 + 2u + 4u * j + k];
    }
#else
    // Legacy blocks: the QRAW words holding block c.
    uint i0 = (row_byte + c * QBYTES) >> 2;
    QUNROLL for (uint k = 0u; k < QRAW; k++) {
        raw[k] = w[i0 + k];
    }
#endif
}

// v[i] = element 32c + i of the row of n elements at byte row_byte (0 past the row's end), from
// the words chunk_fetch(row_byte, c, n, raw) loaded: arithmetic only.
void chunk_decode(uint raw[QRAW], uint row_byte, uint c, uint n, out float v[32]) {
#if defined(QTYPE_F32)
    uint len = chunk_len(c, n);
    QUNROLL for (uint i = 0u; i < 32u; i++) {
        v[i] = i < len ? uintBitsToFloat(raw[i]) : 0.0;
    }
#elif defined(QTYPE_F16)
    uint len = chunk_len(c, n);
    bool h = ((row_byte + 64u * c) & 2u) != 0u;
    QUNROLL for (uint i = 0u; i < 32u; i++) {
        v[i] = i < len ? unpackHalf2x16(WIN_U16(raw, 2u * i, h)).x : 0.0;
    }
#elif defined(QTYPE_BF16)
    // bf16 is the top half of an f32.
    uint len = chunk_len(c, n);
    bool h = ((row_byte + 64u * c) & 2u) != 0u;
    QUNROLL for (uint i = 0u; i < 32u; i++) {
        v[i] = i < len ? uintBitsToFloat(WIN_U16(raw, 2u * i, h) << 16) : 0.0;
    }
#elif defined(QTYPE_Q4_0) || defined(QTYPE_Q5_0) || defined(QTYPE_IQ4_NL)
    bool h = ((row_byte + c * QBYTES) & 2u) != 0u;
    float d = unpackHalf2x16(WIN_U16(raw, 0u, h)).x;
#ifdef QTYPE_Q5_0
    uint qh = WIN_U32(raw, 2u, h);
#define QS_AT 6u
#else
#define QS_AT 2u
#endif
    // Element i < 16 is the low nibble of qs byte i, i + 16 the high nibble.
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        uint u = WIN_U32(raw, QS_AT + 4u * k, h);
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            uint e = 4u * k + i;
#if defined(QTYPE_Q5_0)
            v[e] = d * float(int((byte_of(u, i) & 0xFu) | (((qh >> e) & 1u) << 4)) - 16);
            v[e + 16u] = d * float(int((byte_of(u, i) >> 4) | (((qh >> (e + 16u)) & 1u) << 4)) - 16);
#elif defined(QTYPE_IQ4_NL)
            v[e] = d * float(IQ4NL_VALUE(byte_of(u, i) & 0xFu));
            v[e + 16u] = d * float(IQ4NL_VALUE(byte_of(u, i) >> 4));
#else
            v[e] = d * float(int(byte_of(u, i) & 0xFu) - 8);
            v[e + 16u] = d * float(int(byte_of(u, i) >> 4) - 8);
#endif
        }
    }
#undef QS_AT
#elif defined(QTYPE_Q4_1) || defined(QTYPE_Q5_1)
    float d = HALF_OF(raw[0], false);
    float m = HALF_OF(raw[0], true);
#ifdef QTYPE_Q5_1
    uint qh = raw[1];
#define QS_AT 2u
#else
#define QS_AT 1u
#endif
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        uint u = raw[QS_AT + k];
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            uint e = 4u * k + i;
#ifdef QTYPE_Q5_1
            v[e] = qmad(d, float((byte_of(u, i) & 0xFu) | (((qh >> e) & 1u) << 4)), m);
            v[e + 16u] = qmad(d, float((byte_of(u, i) >> 4) | (((qh >> (e + 16u)) & 1u) << 4)), m);
#else
            v[e] = qmad(d, float(byte_of(u, i) & 0xFu), m);
            v[e + 16u] = qmad(d, float(byte_of(u, i) >> 4), m);
#endif
        }
    }
#undef QS_AT
#elif defined(QTYPE_Q8_0)
    bool h = ((row_byte + c * QBYTES) & 2u) != 0u;
    float d = unpackHalf2x16(WIN_U16(raw, 0u, h)).x;
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        int u = int(WIN_U32(raw, 2u + 4u * k, h));
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            v[4u * k + i] = d * float(bitfieldExtract(u, int(8u * i), 8));
        }
    }
#elif defined(QTYPE_MXFP4)
    // The block starts at byte o = b & 3 of raw[0]: e is byte o, qs word k the four bytes from
    // o + 1 + 4k, i.e. raw[k + 1] itself when o = 3, else the funnel of raw[k] and raw[k + 1]
    // (sh is clamped so that the unused funnel at o = 3 shifts by less than 32).
    //
    // Codes decode two at a time, one per 16-bit half, as f16 bit patterns of ggml's doubled
    // code book: an E2M1 code's exponent and mantissa bits (em) moved to bits 9..11 with 15
    // added to the exponent read 2, 3, 4, 6, 8, 12 for em = 2..7 (E2M1's normals); em = 0 and 1
    // (zero and E2M1's one subnormal) would read 1.0 and 1.5, so those halves are corrected to
    // em * 1.0. No f16 subnormal occurs (a device may flush those); the sign is bit 15.
    uint o = (row_byte + c * QBYTES) & 3u;
    uint e8 = byte_of(raw[0], o);
    // 2^(e - 128), half the E8M0 scale (ggml halves the scale, its code book is doubled).
    // For e = 0 and 1 that is an f32 subnormal, which a device may flush to zero as an operand
    // (the H100 does): d is 2^-64 then and the rest, 2^(e - 64), is applied after, so products
    // that are normal come out exact (products of powers of two, as on the CPU).
    float d = uintBitsToFloat(e8 < 2u ? 63u << 23 : (e8 - 1u) << 23);
    uint sh = 8u * min(o + 1u, 3u);
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        uint u = o == 3u ? raw[k + 1u] : (raw[k] >> sh) | (raw[k + 1u] << (32u - sh));
        // nibble pairs: the low nibbles of bytes 0 and 2, then 1 and 3 (elements 4k, 4k + 2
        // and 4k + 1, 4k + 3), then the high nibbles (the same elements + 16)
        QUNROLL for (uint j = 0u; j < 4u; j++) {
            uint t = (u >> (2u * (j & 2u) + 8u * (j & 1u))) & 0x000F000Fu;
            uint em = t & 0x00070007u;
            uint lt2 = ~((em >> 1) | (em >> 2)) & 0x00010001u; // 1 in the halves where em < 2
            uint bits = (em << 9) + 0x3C003C00u - lt2 * 0x3C00u + (em & lt2) * 0x3A00u;
            vec2 f = unpackHalf2x16(bits | ((t << 12) & 0x80008000u)) * d;
            uint e = 4u * k + (j & 1u) + 8u * (j & 2u);
            v[e] = f.x;
            v[e + 2u] = f.y;
        }
    }
    if (e8 < 2u) {
        float tiny = uintBitsToFloat((e8 + 63u) << 23);
        QUNROLL for (uint i = 0u; i < 32u; i++) {
            v[i] *= tiny;
        }
    }
#elif defined(QTYPE_Q2_K)
    // Sub-chunk j = c % 8 is sub-blocks 2j (elements l < 16) and 2j + 1: code l is bits
    // 2 * (j % 4) of qs byte l; scale byte s holds the 4-bit scale (low) and min (high).
    uint j = c % 8u;
    float d = HALF_OF(raw[9], false);
    float dmin = HALF_OF(raw[9], true);
    uint sp = HALF_BITS(raw[8], (j & 1u) != 0u); // scale bytes 2j, 2j + 1
    float dl0 = d * float(sp & 0xFu);
    float ml0 = dmin * float((sp >> 4) & 0xFu);
    float dl1 = d * float((sp >> 8) & 0xFu);
    float ml1 = dmin * float(sp >> 12);
    uint shift = 2u * (j % 4u);
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        uint u = raw[k];
        float dl = k < 4u ? dl0 : dl1;
        float ml = k < 4u ? ml0 : ml1;
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            v[4u * k + i] = qmad(dl, float((byte_of(u, i) >> shift) & 3u), -ml);
        }
    }
#elif defined(QTYPE_Q3_K)
    // Sub-chunk j = c % 8 is sub-blocks 2j (elements l < 16) and 2j + 1: code l is bits
    // 2 * (j % 4) of qs byte l, minus 4 unless bit j of hmask byte l is set. Sub-block s's 6-bit
    // scale: low nibble of scale byte s (s < 8) or high nibble of byte s - 8, top 2 bits at
    // 2 * (s / 4) of byte 8 + s % 4; for s = 2j, 2j + 1 those byte pairs are half-words.
    uint bb = row_byte + (c / 8u) * QBYTES;
    uint j = c % 8u;
    bool h = (bb & 2u) != 0u;
    uint s0 = WIN_U32(raw, 72u, h); // scale bytes 0..4 (the window raw[18..22) at byte 72)
    uint s1 = WIN_U32(raw, 76u, h);
    uint s2 = WIN_U32(raw, 80u, h);
    float d = HALF_OF(raw[21], h); // region byte 12: word 3 of the window, half h
    uint lp = HALF_BITS((j % 4u) < 2u ? s0 : s1, (j & 1u) != 0u);
    uint hp = HALF_BITS(s2, (j & 1u) != 0u);
    uint lsh = j < 4u ? 0u : 4u;
    uint hsh = 2u * (j / 2u);
    int sc0 = int(((lp >> lsh) & 0xFu) | (((hp >> hsh) & 3u) << 4)) - 32;
    int sc1 = int(((lp >> (8u + lsh)) & 0xFu) | (((hp >> (8u + hsh)) & 3u) << 4)) - 32;
    float dl0 = d * float(sc0);
    float dl1 = d * float(sc1);
    uint shift = 2u * (j % 4u);
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        uint um = WIN_U32(raw, 4u * k, h);
        uint uq = WIN_U32(raw, 36u + 4u * k, h); // raw[9..18): byte offset 36
        float dl = k < 4u ? dl0 : dl1;
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            int q = int((byte_of(uq, i) >> shift) & 3u) - (((byte_of(um, i) >> j) & 1u) != 0u ? 0 : 4);
            v[4u * k + i] = dl * float(q);
        }
    }
#elif defined(QTYPE_IQ4_XS)
    // Sub-block j = c % 8: 6-bit scale from nibble j % 2 of scales_l byte j / 2 and bits 2j of
    // scales_h; elements l < 16 the low nibbles of the 16 qs bytes, the rest the high nibbles.
    uint j = c % 8u;
    float d = HALF_OF(raw[0], false);
    uint ls = ((byte_of(raw[1], j / 2u) >> (4u * (j % 2u))) & 0xFu) | (((raw[0] >> (16u + 2u * j)) & 3u) << 4);
    float dl = d * float(int(ls) - 32);
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        uint u = raw[2u + k];
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            uint e = 4u * k + i;
            v[e] = dl * float(IQ4NL_VALUE(byte_of(u, i) & 0xFu));
            v[e + 16u] = dl * float(IQ4NL_VALUE(byte_of(u, i) >> 4));
        }
    }
#elif defined(QTYPE_Q4_K) || defined(QTYPE_Q5_K)
    // Sub-block j = c % 8: 6-bit scale and min from the 12 scale bytes (raw[1..4)): for j < 4 the
    // low 6 bits of bytes j and j + 4; else the nibbles of byte j + 4 with the top 2 bits of bytes
    // j - 4 (scale) and j (min). Codes: nibble j % 2 of the qs bytes (and bit j of the qh bytes).
    uint j = c % 8u;
    uint jb = j % 4u; // byte j, j - 4 or j + 4 within its scale word
    float d = HALF_OF(raw[0], false);
    float dmin = HALF_OF(raw[0], true);
    uint s0 = byte_of(raw[1], jb);
    uint s1 = byte_of(raw[2], jb);
    uint s2 = byte_of(raw[3], jb);
    uint sc = j < 4u ? s0 & 63u : (s2 & 0xFu) | ((s0 >> 6) << 4);
    uint mn = j < 4u ? s1 & 63u : (s2 >> 4) | ((s1 >> 6) << 4);
    float d1 = d * float(sc);
    float m1 = dmin * float(mn);
#ifdef QTYPE_Q5_K
#define QS_AT 12u
#else
#define QS_AT 4u
#endif
    uint shift = 4u * (j % 2u);
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        uint u = raw[QS_AT + k];
#ifdef QTYPE_Q5_K
        uint hb = raw[4u + k];
#endif
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            uint q = (byte_of(u, i) >> shift) & 0xFu;
#ifdef QTYPE_Q5_K
            q |= ((byte_of(hb, i) >> j) & 1u) << 4;
#endif
            v[4u * k + i] = qmad(d1, float(q), -m1);
        }
    }
#undef QS_AT
#elif defined(QTYPE_Q6_K)
    // Sub-chunk j = c % 8 is quarter k = j % 4 of half j / 4: low nibbles from
    // ql[64(j/4) + 32(k%2) + l] >> 4(k/2), high 2 bits from qh[32(j/4) + l] >> 2k; elements
    // l < 16 use scale 2j, the rest 2j + 1. The ql and qh windows and d lie at offsets of the
    // block that are multiples of 4 (the block's bit (bb & 2) places them), the scale pair at
    // 192 + 2j.
    uint bb = row_byte + (c / 8u) * QBYTES;
    uint j = c % 8u;
    uint k4 = j % 4u;
    bool h = (bb & 2u) != 0u;
    float d = HALF_OF(raw[19], h);
    uint sp = HALF_BITS(raw[18], ((bb + 2u * j) & 2u) != 0u); // scales 2j, 2j + 1
    float dl0 = d * float(bitfieldExtract(int(sp), 0, 8));
    float dl1 = d * float(bitfieldExtract(int(sp), 8, 8));
    uint lo_shift = 4u * (k4 / 2u);
    uint hi_shift = 2u * k4;
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        uint ul = WIN_U32(raw, 4u * k, h);
        uint uh = WIN_U32(raw, 36u + 4u * k, h); // raw[9..18): byte offset 36
        float dl = k < 4u ? dl0 : dl1;
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            uint q = ((byte_of(ul, i) >> lo_shift) & 0xFu) | (((byte_of(uh, i) >> hi_shift) & 3u) << 4);
            v[4u * k + i] = dl * float(int(q) - 32);
        }
    }
#endif
}

// v[i] = element 32c + i of the row of n elements starting at byte row_byte (0 past the row's end).
void dequant_chunk(uint row_byte, uint c, uint n, out float v[32]) {
    uint raw[QRAW];
    chunk_fetch(row_byte, c, n, raw);
    chunk_decode(raw, row_byte, c, n, v);
}

#if defined(QTYPE_Q4_K) && defined(QPAIRS) && !defined(QSECOND)
// Q4_K, 64 elements at a time (matvec.comp's block layout, which defines QPAIRS): elements [64p, 64p + 64) of a
// super-block are the low nibbles (the first 32) and the high nibbles (the last 32) of its qs
// bytes [32p, 32p + 32), under sub-blocks 2p and 2p + 1. h: the block's first 16 bytes (d, dmin,
// the 12 scale bytes); q0, q1: those 32 qs bytes; xv: the 64 inputs; sx: the sums of their two
// halves. The dot product is factored per sub-block as d·sc·Σq·x − dmin·mn·Σx: the codes enter
// as exact small floats (2²³ + q read as a float, minus 2²³: no integer conversion, which runs at
// a quarter of the FMA rate) and the scales once per 32 elements rather than once per element.
float q4k_pair_dot(uvec4 h, uvec4 q0, uvec4 q1, uint p, vec4 xv[16], vec2 sx) {
    uvec2 sc;
    uvec2 mn;
    kq_pair_scales(h.yzw, p, sc, mn);
    vec2 dm = unpackHalf2x16(h.x);
    const uint MAGIC = 0x4B000000u; // 2^23
    const float BIAS = 8388608.0;
    vec2 lo = vec2(0.0); // two chains each, for latency
    vec2 hi = vec2(0.0);
    [[unroll]] for (uint m = 0u; m < 8u; m++) {
        uint u = m < 4u ? q0[m] : q1[m - 4u];
        [[unroll]] for (uint b = 0u; b < 4u; b++) {
            float ql = uintBitsToFloat(((u >> (8u * b)) & 0xFu) | MAGIC) - BIAS;
            float qh = uintBitsToFloat(((u >> (8u * b + 4u)) & 0xFu) | MAGIC) - BIAS;
            lo[m & 1u] = fma(ql, xv[m][b], lo[m & 1u]);
            hi[m & 1u] = fma(qh, xv[8u + m][b], hi[m & 1u]);
        }
    }
    vec2 q = vec2(lo.x + lo.y, hi.x + hi.y);
    return dm.x * dot(vec2(sc), q) - dm.y * dot(vec2(mn), sx);
}
#endif

#ifdef QSECOND
#undef w
#undef qmad
#undef chunk_count
#undef chunk_len
#undef chunk_fetch
#undef chunk_decode
#undef dequant_chunk
#endif
