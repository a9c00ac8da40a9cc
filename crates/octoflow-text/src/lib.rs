//! Tokenizers from GGUF metadata, chat templates, sampling.
