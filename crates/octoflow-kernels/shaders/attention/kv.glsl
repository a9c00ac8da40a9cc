// The KV cache's element type, shared by every kernel that reads or writes the cache
// (attention.comp, attention_coop.comp, attention_decode.comp, rope_store.comp). Include it with
// the #extension lines, before the first declaration.
//
// Default: f32. With KV_F16 (the `*_kv16` variants in variants.txt): f16 through 16-bit storage
// (VK_KHR_16bit_storage's storageBuffer16BitAccess): values are converted on load and store and
// all arithmetic stays f32, so the only change is the rounding of what the cache holds.
//   KV_T / KV4_T   the cache's scalar / 4-vector element, for buffer declarations;
//   kv_store(x)    x as stored (KV_T);
//   kv_round(x)    a vec4 rounded as the cache would round it: the decode kernel's fused path
//                  reads the step's own keys and values from shared memory, and rounds them so
//                  that they are exactly what a later step reads back from the cache.
#ifdef KV_F16
#extension GL_EXT_shader_16bit_storage : require
#define KV_T float16_t
#define KV4_T f16vec4
#define kv_store(x) float16_t(x)
#define kv_round(x) f16_round4(x)

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

vec4 f16_round4(vec4 x) {
    return vec4(f16_round(x.x), f16_round(x.y), f16_round(x.z), f16_round(x.w));
}
#else
#define KV_T float
#define KV4_T vec4
#define kv_store(x) (x)
#define kv_round(x) (x)
#endif
