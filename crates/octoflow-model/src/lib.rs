//! Architectures (llama, qwen2, gemma3), weights, KV cache, CPU reference forward and GPU chains.
