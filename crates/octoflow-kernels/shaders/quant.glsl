// Reading GGUF-encoded weight rows from a `uint` word array: byte/u16/u32 loads and, per weight
// type, the dequantization of one 32-element chunk of a row — the unit every quantized kernel
// uses.
//
// Before including this file a shader defines exactly one QTYPE_* (QTYPE_F32, QTYPE_F16,
// QTYPE_Q4_0, QTYPE_Q4_1, QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q8_0, QTYPE_Q4_K, QTYPE_Q5_K,
// QTYPE_Q6_K) and declares the weights as a buffer with the member `uint w[];` (32-bit words of
// the little-endian GGUF bytes). Blocks are only 2-byte aligned, so every multi-byte field is
// read through the helpers below. A row of n elements starts at byte `row_byte` (row r of a
// matrix: r * row_bytes, row_bytes = quantized_size(type, n)).
//
// Chunk c of a row holds elements [32c, 32c + 32). For the legacy types it is block c; for the
// K-quants it is sub-chunk c % 8 of super-block c / 8. For F32/F16 the last chunk may be partial
// (n not a multiple of 32): dequant_chunk zero-fills past n and chunk_len() says how many are real.
//
// Products are formed as the CPU codecs form them (scale times code, minus the min last).
//
// A shader that reads a second matrix of the same type (matvec.comp's GLU variants: the up
// matrix next to the gate matrix) includes this file again with QSECOND defined: that copy reads
// the buffer member `uint w2[]` and every function in it carries the suffix _2 (dequant_chunk_2,
// ...); the layout constants are defined again, identically.
#ifdef QSECOND
#define w w2
#define qw_u8 qw_u8_2
#define qw_u16 qw_u16_2
#define qw_u32 qw_u32_2
#define qw_f16 qw_f16_2
#define byte_of byte_of_2
#define win_load win_load_2
#define qmad qmad_2
#define chunk_count chunk_count_2
#define chunk_len chunk_len_2
#define nibbles32 nibbles32_2
#define scale_min_k4 scale_min_k4_2
#define dequant_chunk dequant_chunk_2
#endif

// ---- byte access ---------------------------------------------------------------------------

// The byte at offset b.
uint qw_u8(uint b) {
    return (w[b >> 2] >> ((b & 3u) * 8u)) & 0xFFu;
}

// The little-endian u16 at the even offset b.
uint qw_u16(uint b) {
    return (w[b >> 2] >> ((b & 2u) * 8u)) & 0xFFFFu;
}

// QCPU (defined by the CPU-driver shader) implies QWINDOW; QWINDOW alone (the tensor-core matmul)
// gives the same decoding: constant-trip loops are unrolled, and u32 reads avoid divergent
// branches (a per-lane branch runs both sides on a CPU; on a GPU branch-free reads let all of a
// chunk's loads be in flight at once instead of one dependent branch per word).
#ifdef QCPU
#define QWINDOW 1
#endif
#ifdef QWINDOW
#define QUNROLL [[unroll]]
#else
#define QUNROLL
#endif

#ifdef QWINDOW
// The little-endian u32 at offset b: one word read for QALIGN4 types (blocks and rows are
// 4-byte multiples), else the word(s) holding it, without branches.
uint qw_u32(uint b) {
    uint i = b >> 2;
#ifdef QALIGN4
    return w[i];
#else
    uint s = (b & 3u) * 8u;
    uint lo = w[i];
    uint hi = w[i + (s != 0u ? 1u : 0u)];
    return s == 0u ? lo : (lo >> s) | (hi << (32u - s));
#endif
}
#else
// The little-endian u32 at offset b (any alignment). Reads the next word only when the value
// straddles it.
uint qw_u32(uint b) {
    uint i = b >> 2;
    uint s = (b & 3u) * 8u;
    if (s == 0u) {
        return w[i];
    }
    return (w[i] >> s) | (w[i + 1u] << (32u - s));
}
#endif

// The IEEE f16 at the even offset b, as f32.
float qw_f16(uint b) {
    return unpackHalf2x16(qw_u16(b)).x;
}

// Byte k (0..3) of word u.
uint byte_of(uint u, uint k) {
    return (u >> (8u * k)) & 0xFFu;
}

#ifdef QWINDOW
// Windows of words (QWINDOW): a 2-byte aligned region is read once as whole words raw[0..] from
// word (b >> 2), h = bit 1 of b; then the u32 / u16 at even region offset o (a constant):
#define QFUNNEL(a, b) (((a) >> 16) | ((b) << 16))
#define WIN_U32(raw, o, h) ((((o) & 2u) != 0u) \
    ? ((h) ? raw[((o) >> 2) + 1u] : QFUNNEL(raw[(o) >> 2], raw[((o) >> 2) + 1u])) \
    : ((h) ? QFUNNEL(raw[(o) >> 2], raw[((o) >> 2) + 1u]) : raw[(o) >> 2]))
#define WIN_U16(raw, o, h) ((((o) & 2u) != 0u) \
    ? ((h) ? (raw[((o) >> 2) + 1u] & 0xFFFFu) : (raw[(o) >> 2] >> 16)) \
    : ((h) ? (raw[(o) >> 2] >> 16) : (raw[(o) >> 2] & 0xFFFFu)))

// raw[0..n) = the n words from word b >> 2; raw[n..NWMAX) = 0 (never read for real).
#define NWMAX 10u
void win_load(uint b, uint n, out uint raw[NWMAX]) {
    uint i0 = b >> 2;
    QUNROLL for (uint k = 0u; k < NWMAX; k++) {
        raw[k] = k < n ? w[i0 + k] : 0u;
    }
}
#endif

// a * b + c rounded twice, as the CPU codecs compute it: `precise` forbids the fused
// multiply-add, so decoded weights agree bit for bit with `octoflow_gguf::quant::dequantize`
// (kernels that round them further, to f16, then round the same values).
float qmad(float a, float b, float c) {
    precise float r = a * b + c;
    return r;
}

// ---- per-type layout constants --------------------------------------------------------------
// QK: elements per block; QBYTES: bytes per block; QDENSE: a float type (block of one element).

#if defined(QTYPE_F32)
#define QALIGN4 1
#define QK 1u
#define QBYTES 4u
#define QDENSE 1
#elif defined(QTYPE_F16)
#define QK 1u
#define QBYTES 2u
#define QDENSE 1
#elif defined(QTYPE_Q4_0)
#define QK 32u
#define QBYTES 18u
#elif defined(QTYPE_Q4_1)
#define QALIGN4 1
#define QK 32u
#define QBYTES 20u
#elif defined(QTYPE_Q5_0)
#define QK 32u
#define QBYTES 22u
#elif defined(QTYPE_Q5_1)
#define QALIGN4 1
#define QK 32u
#define QBYTES 24u
#elif defined(QTYPE_Q8_0)
#define QK 32u
#define QBYTES 34u
#elif defined(QTYPE_Q4_K)
#define QALIGN4 1
#define QK 256u
#define QBYTES 144u
#elif defined(QTYPE_Q5_K)
#define QALIGN4 1
#define QK 256u
#define QBYTES 176u
#elif defined(QTYPE_Q6_K)
#define QK 256u
#define QBYTES 210u
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

// ---- helpers of the block formats ------------------------------------------------------------

// Legacy 4-bit codes: 16 bytes at qs; element j < 16 is the low nibble of byte j, j + 16 the high.
void nibbles32(uint qs, out uint q[32]) {
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        uint u = qw_u32(qs + 4u * k);
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            uint b = byte_of(u, i);
            q[4u * k + i] = b & 0xFu;
            q[4u * k + i + 16u] = b >> 4;
        }
    }
}

#if defined(QTYPE_Q4_K) || defined(QTYPE_Q5_K)
// The 6-bit scale (x) and min (y) of sub-block j (0..8) from the 12 scale bytes at s.
uvec2 scale_min_k4(uint s, uint j) {
    if (j < 4u) {
        return uvec2(qw_u8(s + j) & 63u, qw_u8(s + j + 4u) & 63u);
    }
    uint hi_s = qw_u8(s + j - 4u) >> 6;
    uint hi_m = qw_u8(s + j) >> 6;
    uint lo = qw_u8(s + j + 4u);
    return uvec2((lo & 0xFu) | (hi_s << 4), (lo >> 4) | (hi_m << 4));
}
#endif

// ---- the chunk dequantizer --------------------------------------------------------------------

// v[i] = element 32c + i of the row of n elements starting at byte row_byte (0 past the row's end).
void dequant_chunk(uint row_byte, uint c, uint n, out float v[32]) {
#if defined(QTYPE_F32)
    uint base = (row_byte >> 2) + 32u * c;
    uint len = chunk_len(c, n);
    QUNROLL for (uint i = 0u; i < 32u; i++) {
        v[i] = i < len ? uintBitsToFloat(w[base + i]) : 0.0;
    }
#elif defined(QTYPE_F16)
    uint base = row_byte + 64u * c;
    uint len = chunk_len(c, n);
    QUNROLL for (uint i = 0u; i < 32u; i++) {
        v[i] = i < len ? qw_f16(base + 2u * i) : 0.0;
    }
#elif defined(QTYPE_Q4_0)
    uint bb = row_byte + c * QBYTES;
#ifdef QWINDOW
    // [d:2][qs:16] spans 5 words whatever its alignment.
    uint raw[NWMAX];
    win_load(bb, 5u, raw);
    bool h = (bb & 2u) != 0u;
    float d = unpackHalf2x16(WIN_U16(raw, 0u, h)).x;
    uint q[32];
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        uint u = WIN_U32(raw, 2u + 4u * k, h);
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            q[4u * k + i] = byte_of(u, i) & 0xFu;
            q[4u * k + i + 16u] = byte_of(u, i) >> 4;
        }
    }
#else
    float d = qw_f16(bb);
    uint q[32];
    nibbles32(bb + 2u, q);
#endif
    QUNROLL for (uint i = 0u; i < 32u; i++) {
        v[i] = d * float(int(q[i]) - 8);
    }
#elif defined(QTYPE_Q4_1)
    uint bb = row_byte + c * QBYTES;
    float d = qw_f16(bb);
    float m = qw_f16(bb + 2u);
    uint q[32];
    nibbles32(bb + 4u, q);
    QUNROLL for (uint i = 0u; i < 32u; i++) {
        v[i] = qmad(d, float(q[i]), m);
    }
#elif defined(QTYPE_Q5_0)
    uint bb = row_byte + c * QBYTES;
#ifdef QWINDOW
    // [d:2][qh:4][qs:16] spans 6 words whatever its alignment.
    uint raw[NWMAX];
    win_load(bb, 6u, raw);
    bool h = (bb & 2u) != 0u;
    float d = unpackHalf2x16(WIN_U16(raw, 0u, h)).x;
    uint qh = WIN_U32(raw, 2u, h);
    uint q[32];
    QUNROLL for (uint k = 0u; k < 4u; k++) {
        uint u = WIN_U32(raw, 6u + 4u * k, h);
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            q[4u * k + i] = byte_of(u, i) & 0xFu;
            q[4u * k + i + 16u] = byte_of(u, i) >> 4;
        }
    }
#else
    float d = qw_f16(bb);
    uint qh = qw_u32(bb + 2u);
    uint q[32];
    nibbles32(bb + 6u, q);
#endif
    QUNROLL for (uint i = 0u; i < 32u; i++) {
        v[i] = d * float(int(q[i] | (((qh >> i) & 1u) << 4)) - 16);
    }
#elif defined(QTYPE_Q5_1)
    uint bb = row_byte + c * QBYTES;
    float d = qw_f16(bb);
    float m = qw_f16(bb + 2u);
    uint qh = qw_u32(bb + 4u);
    uint q[32];
    nibbles32(bb + 8u, q);
    QUNROLL for (uint i = 0u; i < 32u; i++) {
        v[i] = qmad(d, float(q[i] | (((qh >> i) & 1u) << 4)), m);
    }
#elif defined(QTYPE_Q8_0)
    uint bb = row_byte + c * QBYTES;
#ifdef QWINDOW
    // [d:2][qs:32] spans 9 words whatever its alignment.
    uint raw[NWMAX];
    win_load(bb, 9u, raw);
    bool h = (bb & 2u) != 0u;
    float d = unpackHalf2x16(WIN_U16(raw, 0u, h)).x;
#else
    float d = qw_f16(bb);
#endif
    QUNROLL for (uint k = 0u; k < 8u; k++) {
#ifdef QWINDOW
        int u = int(WIN_U32(raw, 2u + 4u * k, h));
#else
        int u = int(qw_u32(bb + 2u + 4u * k));
#endif
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            v[4u * k + i] = d * float(bitfieldExtract(u, int(8u * i), 8));
        }
    }
#elif defined(QTYPE_Q4_K) || defined(QTYPE_Q5_K)
    // [d:2][dmin:2][scales:12]([qh:32] for Q5_K)[qs:128]; sub-block j = c % 8 reads qs bytes
    // 32*(j/2).. at nibble j%2, and bit j of qh.
    uint bb = row_byte + (c / 8u) * QBYTES;
    uint j = c % 8u;
    float d = qw_f16(bb);
    float dmin = qw_f16(bb + 2u);
    uvec2 sm = scale_min_k4(bb + 4u, j);
    float d1 = d * float(sm.x);
    float m1 = dmin * float(sm.y);
#ifdef QTYPE_Q5_K
    uint qs = bb + 48u + 32u * (j / 2u);
    uint qh = bb + 16u;
#else
    uint qs = bb + 16u + 32u * (j / 2u);
#endif
    uint shift = 4u * (j % 2u);
    QUNROLL for (uint k = 0u; k < 8u; k++) {
        uint u = qw_u32(qs + 4u * k);
#ifdef QTYPE_Q5_K
        uint h = qw_u32(qh + 4u * k);
#endif
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            uint q = (byte_of(u, i) >> shift) & 0xFu;
#ifdef QTYPE_Q5_K
            q |= ((byte_of(h, i) >> j) & 1u) << 4;
#endif
            v[4u * k + i] = qmad(d1, float(q), -m1);
        }
    }
#elif defined(QTYPE_Q6_K)
    // [ql:128][qh:64][scales:16 x i8][d:2]; sub-chunk j = c % 8 is quarter k = j % 4 of half
    // n = j / 4: low nibbles from ql[64n + 32(k%2) + l] >> 4(k/2), high 2 bits from
    // qh[32n + l] >> 2k; elements l < 16 use scale 2j, the rest 2j + 1.
    uint bb = row_byte + (c / 8u) * QBYTES;
    uint j = c % 8u;
    uint hn = j / 4u;
    uint k4 = j % 4u;
    float d = qw_f16(bb + 208u);
    float dl0 = d * float(bitfieldExtract(int(qw_u8(bb + 192u + 2u * j)), 0, 8));
    float dl1 = d * float(bitfieldExtract(int(qw_u8(bb + 193u + 2u * j)), 0, 8));
    uint lo = bb + 64u * hn + 32u * (k4 % 2u);
    uint hi = bb + 128u + 32u * hn;
    uint lo_shift = 4u * (k4 / 2u);
    uint hi_shift = 2u * k4;
#ifdef QWINDOW
    // The 32 bytes at lo and at hi (even offsets inside the block) as 9-word windows.
    uint rl[NWMAX];
    uint rh[NWMAX];
    win_load(lo, 9u, rl);
    win_load(hi, 9u, rh);
    bool hl = (lo & 2u) != 0u;
    bool hh = (hi & 2u) != 0u;
#endif
    QUNROLL for (uint k = 0u; k < 8u; k++) {
#ifdef QWINDOW
        uint ul = WIN_U32(rl, 4u * k, hl);
        uint uh = WIN_U32(rh, 4u * k, hh);
#else
        uint ul = qw_u32(lo + 4u * k);
        uint uh = qw_u32(hi + 4u * k);
#endif
        float dl = k < 4u ? dl0 : dl1;
        QUNROLL for (uint i = 0u; i < 4u; i++) {
            uint q = ((byte_of(ul, i) >> lo_shift) & 0xFu) | (((byte_of(uh, i) >> hi_shift) & 3u) << 4);
            v[4u * k + i] = dl * float(int(q) - 32);
        }
    }
#endif
}

#ifdef QSECOND
#undef w
#undef qw_u8
#undef qw_u16
#undef qw_u32
#undef qw_f16
#undef byte_of
#undef win_load
#undef qmad
#undef chunk_count
#undef chunk_len
#undef nibbles32
#undef scale_min_k4
#undef dequant_chunk
#endif
