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
#define kv_round(x) vec4(f16vec4(x))
#else
#define KV_T float
#define KV4_T vec4
#define kv_store(x) (x)
#define kv_round(x) (x)
#endif
