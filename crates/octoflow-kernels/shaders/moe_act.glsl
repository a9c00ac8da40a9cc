// The activation of a mixture-of-experts gate and up value, shared by the GLU variants of
// moe_matvec.comp, moe_matmul.comp and matmul_coop.comp's MOE variants: op 0 is SiLU, silu(g) * u (qwen3moe); op 1 is gpt-oss's
// clamped SwiGLU (llama.cpp's swiglu_oai): x = min(g, limit), y = clamp(u, -limit, limit),
// x * sigmoid(alpha * x) * (y + 1). Kept apart from glu.glsl, whose activations take the gate
// alone.
float moe_act(float g, float u, uint op, float alpha, float limit) {
    if (op == 0u) {
        return g / (1.0 + exp(-g)) * u;
    }
    float x = min(g, limit);
    float y = clamp(u, -limit, limit);
    return x / (1.0 + exp(-alpha * x)) * (y + 1.0);
}
