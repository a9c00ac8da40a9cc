#!/usr/bin/env python3
"""Builds a tiny random Hugging Face folder (qwen2 family, hidden 64, 2 layers, a 300-token
byte-level BPE trained here with qwen2's pre-tokenizer) with transformers' save_pretrained, and
stores transformers' logits for a few prompts beside it (golden.json: token ids and logits).

Usage: python3 scripts/check/hf_tiny.py OUT_DIR
Needs torch, transformers and tokenizers (not in CI: the folder and goldens are committed)."""
import json, sys
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, Regex
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
TEXT = ["The quick brown fox jumps over the lazy dog. " * 4, "Hello world, 12345 numbers and words! " * 4,
        "A tiny model for tests: safetensors, tokenizers and logits. " * 4]
PROMPTS = ["The quick brown fox", "Hello world, 42 words!", "tiny tests: logits"]

def main(out):
    torch.manual_seed(0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(out)
    cfg = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, eos_token_id=tok.token_to_id("<|endoftext|>"))
    model = Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    golden = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tok.encode(prompt).ids
            logits = model(torch.tensor([ids])).logits[0].tolist()
            golden.append({"prompt": prompt, "tokens": ids, "logits": logits})
    json.dump(golden, open(f"{out}/golden.json", "w"))

if __name__ == "__main__":
    main(sys.argv[1])
