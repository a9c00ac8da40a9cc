// The activations of the gated linear unit, shared by glu.comp and the fused GLU variants of
// matvec.comp / linear_cpu.comp (so both compute the same function the same way):
// act(g) = SiLU g * sigmoid(g) (op 0) or the tanh approximation of GELU (op 1),
// 0.5 g (1 + tanh(u)) with u = sqrt(2/pi) (g + 0.044715 g^3), computed as g * sigmoid(2u):
// no tanh overflow, no cancellation for g < 0.
float glu_act(float g, uint op) {
    if (op == 0u) {
        return g / (1.0 + exp(-g));
    }
    float u = 0.7978846 * (g + 0.044715 * g * g * g);
    return g / (1.0 + exp(-2.0 * u));
}
