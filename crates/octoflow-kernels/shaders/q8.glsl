// x quantized per block of 32 values as llama.cpp's q8_1 (the 8-bit integer dot products'
// input): d = max|v| / 127, codes round(v / d) half away from zero, and d times the sum of the
// codes. The includer declares `xq` (uint words: four codes each, lowest byte first) — shared
// memory in the products, a buffer in quantize_q8.comp.

// half away from zero, as llama.cpp's roundf (the reference computes it the same way)
float round_away(float v) {
    return sign(v) * floor(abs(v) + 0.5);
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
