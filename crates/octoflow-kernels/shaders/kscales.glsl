// Bytes of a word and the K-quants' packed 6-bit scales, shared by quant.glsl (the f32/f16
// decoders) and dot.glsl (the 8-bit dot products). Included once per shader whatever includes
// it (quant.glsl's QSECOND copy reads the same helpers).
#ifndef KSCALES_GLSL
#define KSCALES_GLSL

// Byte k (0..3) of word u.
uint byte_of(uint u, uint k) {
    return (u >> (8u * k)) & 0xFFu;
}

// The scales and mins of the Q4_K/Q5_K sub-blocks j = 2p, 2p + 1 from the super-block's scale
// words s (its header words 1..3; bytes jb = j % 4 of each): for j < 4 the low 6 bits of bytes
// j (scale) and j + 4 (min); else the nibbles of byte j + 4 with the top 2 bits of bytes j - 4
// and j.
void kq_pair_scales(uvec3 s, uint p, out uvec2 sc, out uvec2 mn) {
    uint jb = (2u * p) & 3u;
    uvec2 s0 = uvec2(byte_of(s.x, jb), byte_of(s.x, jb + 1u));
    uvec2 s1 = uvec2(byte_of(s.y, jb), byte_of(s.y, jb + 1u));
    uvec2 s2 = uvec2(byte_of(s.z, jb), byte_of(s.z, jb + 1u));
    bool low = p < 2u;
    sc = low ? s0 & 63u : (s2 & 0xFu) | ((s0 >> 6) << 4);
    mn = low ? s1 & 63u : (s2 >> 4) | ((s1 >> 6) << 4);
}

#endif
