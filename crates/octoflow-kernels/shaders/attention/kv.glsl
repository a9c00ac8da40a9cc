// The KV cache's element type, shared by every kernel that reads or writes the cache
// (attention.comp, attention_coop.comp, attention_decode.comp, rope_store.comp). Include it with
// the #extension lines, before the first declaration.
//
// Default: f32. With KV_F16 (the `*_kv16` variants in variants.txt): f16 through 16-bit storage
// (VK_KHR_16bit_storage's storageBuffer16BitAccess): values are converted on load and store and
// all arithmetic stays f32, so the only change is the rounding of what the cache holds.
// With KV_Q8 (`*_kvq8`): llama.cpp's q8_0 in blocks of 32 values of a row, each block 9 words:
// the scale d (max|x| / 127 rounded to f16, kept as an f32 word), then the 32 values' int8s
// (round(x / d), half away from zero) four to a word, lowest byte first. Heads are whole blocks
// (head sizes multiple of 32, checked by the host), so a head's 4-value groups never straddle
// blocks; writers quantize whole blocks (q8_store_block), readers take 4 values at a time
// (q8_ld4).
//   KV_T / KV4_T   the cache's scalar / 4-vector element, for buffer declarations;
//   kv_store(x)    x as stored (KV_T; not for q8_0);
//   kv_round(x)    a vec4 rounded as the cache would round it: the decode kernel's fused path
//                  reads the step's own keys and values from shared memory, and rounds them so
//                  that they are exactly what a later step reads back from the cache (q8_0:
//                  that kernel quantizes the rows in shared memory itself, whole blocks).
#ifdef KV_F16
#extension GL_EXT_shader_16bit_storage : require
#endif
#ifdef KV_Q8
#extension GL_EXT_control_flow_attributes : require
#endif

// x rounded to the nearest f16 value (ties to even: what the f16 store does), kept as f32, in
// integer arithmetic: NVIDIA's compiler drops a plain `vec4(f16vec4(x))` round trip as a no-op,
// which left the step's own values unrounded there.
float f16_round(float x) {
    uint b = floatBitsToUint(x);
    uint a = b & 0x7fffffffu;
    uint s = b & 0x80000000u;
    if (a >= 0x7f800000u) {
        return x; // inf, NaN
    }
    if (a >= 0x477ff000u) {
        return uintBitsToFloat(s | 0x7f800000u); // 65520 and above: f16 infinity
    }
    int e = int(a >> 23u) - 127;
    if (e <= -25) {
        // below half the smallest f16 subnormal (2^-24) or at it (a tie, to the even 0)
        return uintBitsToFloat(s | (a > 0x33000000u ? 0x33800000u : 0u));
    }
    // mantissa bits dropped: 13 for f16 normals, one more per binade below 2^-14
    uint drop = uint(max(13, -1 - e));
    uint r = a + ((1u << (drop - 1u)) - 1u) + ((a >> drop) & 1u);
    return uintBitsToFloat(s | (r & ~((1u << drop) - 1u)));
}

#ifdef KV_F16
#define KV_T float16_t
#define KV4_T f16vec4
#define kv_store(x) float16_t(x)
#define kv_round(x) f16_round4(x)

vec4 f16_round4(vec4 x) {
    return vec4(f16_round(x.x), f16_round(x.y), f16_round(x.z), f16_round(x.w));
}
#elif defined(KV_Q8)
#define KV_T uint
#define KV4_T uint
#define kv_round(x) (x)

// the 4 int8s of word w, lowest byte first
vec4 q8_unpack(uint w) {
    int s = int(w);
    return vec4(bitfieldExtract(s, 0, 8), bitfieldExtract(s, 8, 8), bitfieldExtract(s, 16, 8),
                bitfieldExtract(s, 24, 8));
}

// values i .. i + 4 (i a multiple of 4, counted in values from the buffer's start) of q8_0 cache
// buffer `buf` (a uint array)
#define q8_ld4(buf, i) \
    (q8_unpack(buf[((i) >> 5u) * 9u + 1u + (((i) & 31u) >> 2u)]) * uintBitsToFloat(buf[((i) >> 5u) * 9u]))

// x rounded half away from zero, as C's roundf (floor(|x| + 0.5) is off for 0.49999997)
float round_away(float x) {
    float t = trunc(x);
    return abs(x - t) >= 0.5 ? t + sign(x) : t;
}

// 1 / d correctly rounded or within an ulp of it (one Newton step on the device's reciprocal,
// which may be off by more), 0 for d = 0
float q8_inv(float d) {
    if (d == 0.0) {
        return 0.0;
    }
    float r = 1.0 / d;
    return fma(r, fma(-d, r, 1.0), r);
}

// the word of int8s of 4 values x (already multiplied by 1 / d)
uint q8_pack(vec4 x) {
    ivec4 q = ivec4(clamp(vec4(round_away(x.x), round_away(x.y), round_away(x.z), round_away(x.w)),
                          -127.0, 127.0));
    return uint(q.x & 255) | (uint(q.y & 255) << 8u) | (uint(q.z & 255) << 16u) | (uint(q.w & 255) << 24u);
}

// amax / 127 correctly rounded (a compiler may turn the division by a constant into a product
// with its rounded reciprocal; one fma step puts the last bit back)
float q8_div127(float amax) {
    float d = amax * (1.0 / 127.0);
    return fma(fma(-d, 127.0, amax), 1.0 / 127.0, d);
}

// The q8_0 block of the 32 values xs (llama.cpp's quantize_row_q8_0: d from the unrounded
// max|x| / 127, the int8s from x * (1 / d)): its 8 words of int8s in w, and its scale rounded to
// f16 (what is stored) returned. The values come back as q8_unpack(w[i]) times that scale.
float q8_quantize(vec4 xs[8], out uint w[8]) {
    float amax = 0.0;
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        vec4 a = abs(xs[i]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    float d = q8_div127(amax);
    float id = q8_inv(d);
    [[unroll]] for (uint i = 0u; i < 8u; i++) {
        w[i] = q8_pack(xs[i] * id);
    }
    return f16_round(d);
}

// block b (counted in blocks from the buffer's start) of q8_0 cache buffer `buf`: the scale
// word, then the 8 words of int8s (from q8_quantize)
#define q8_store_block(buf, b, d16, w) \
    { \
        buf[(b) * 9u] = floatBitsToUint(d16); \
        [[unroll]] for (uint i_ = 0u; i_ < 8u; i_++) { \
            buf[(b) * 9u + 1u + i_] = w[i_]; \
        } \
    }
#else
#define KV_T float
#define KV4_T vec4
#define kv_store(x) (x)
#define kv_round(x) (x)
#endif
