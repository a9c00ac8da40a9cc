#!/usr/bin/env python3
"""Writes a GGUF with a real model's exact shapes, tensor names, types and metadata, and random
values: for measuring speed and memory at full scale where the real file cannot be fetched (the
GPU machine has no network). Not for quality: the weights are noise, scaled so that activations
stay finite.

Usage: shaped_gguf.py SHAPE OUT.gguf [--layers N] [--seed S]
  SHAPE: gpt-oss-20b  ggml-org's gpt-oss-20b-mxfp4.gguf layout: 24 layers, 2880 wide, 64 query
                      heads and 8 KV heads of 64, 32 experts (4 per token) in MXFP4, attention and
                      embeddings in Q8_0, norms, biases, sinks and the router in F32, YaRN
                      (factor 32 over 4,096), sliding window 128, o200k-sized vocabulary (201,088)
         llama-8b     Llama-3.1-8B as llama.cpp's Q4_K_M makes it: 32 layers, 4096 wide, 14,336
                      feed-forward, 32/8 heads, Q4_K with Q6_K for attn_v and ffn_down on the
                      layers llama.cpp's `use_more_bits` picks, Q6_K output, `rope_freqs`
                      (Llama 3.1's scaling), 128,256-token vocabulary
         qwen2.5-0.5b qwen2.5-coder-0.5b-instruct-q4_k_m.gguf's layout (the golden models' qwen):
                      24 layers, 896 wide, 4,864 feed-forward, 14/2 heads of 64, q/k/v biases,
                      Q5_0 with Q8_0 attn_v and Q6_K ffn_down on the layers that file has them
                      (Q4_K elsewhere for ffn_down), Q5_0 embeddings, Q8_0 output, 151,936 tokens
  --layers N: fewer layers (a quick check of the script itself)

The vocabulary is a synthetic byte-level BPE of the real size (the 256 byte tokens, then every
string over a small alphabet built by merges, then the real family's special tokens at their
real ids), so llama.cpp and octoflow both load it. Needs numpy and gguf-py (PYTHONPATH=
vendor/llama.cpp/gguf-py of the llama-cpp-python sdist, or `pip install gguf`).
"""
import argparse
import itertools
import math
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

BLOCK = {T.Q8_0: (32, 34), T.Q5_0: (32, 22), T.MXFP4: (32, 17), T.Q4_K: (256, 144),
         T.Q6_K: (256, 210)}


def byte_tokens():
    """GPT-2's byte-to-unicode table: the byte-level token of each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def vocabulary(n_vocab, specials):
    """Tokens, token types and merges: bytes, merged strings over a small alphabet in order of
    length (each made by merging its prefix with its last character), specials at their ids,
    `<|reserved_ID|>` control tokens in the ids left over."""
    tokens = byte_tokens()
    alphabet = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ"]
    alphabet += [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    n_plain = min(specials) if specials else n_vocab
    merges = []
    seen = set(tokens)
    for length in itertools.count(2):
        for combo in itertools.product(alphabet, repeat=length):
            if len(tokens) >= n_plain:
                break
            s = "".join(combo)
            if s in seen:
                continue
            seen.add(s)
            merges.append(f"{s[:-1]} {s[-1]}")
            tokens.append(s)
        if len(tokens) >= n_plain:
            break
    types = [1] * len(tokens)
    for i in range(len(tokens), n_vocab):
        tokens.append(specials.get(i, f"<|reserved_{i}|>"))
        types.append(3)
    return tokens, types, merges


def f16_bytes(values):
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def quantized(rng, ty, rows, cols, experts=None):
    """Random blocks of `ty` for a (experts ×) rows × cols matrix, with every block's scale set
    to a value that keeps the weights near ±0.02."""
    per, size = BLOCK[ty]
    assert cols % per == 0, (ty, cols)
    nb = (experts or 1) * rows * (cols // per)
    data = np.frombuffer(rng.bytes(nb * size), dtype=np.uint8).reshape(nb, size).copy()
    if ty == T.Q8_0:
        data[:, 0:2] = f16_bytes(np.full(nb, 0.02 / 64))
    elif ty == T.Q5_0:
        data[:, 0:2] = f16_bytes(np.full(nb, 0.02 / 16))
    elif ty == T.MXFP4:
        # E8M0 exponent 2^-7 times FP4 values up to 6
        data[:, 0] = 127 - 7
    elif ty == T.Q4_K:
        data[:, 0:2] = f16_bytes(np.full(nb, 0.02 / 8 / 32))
        data[:, 2:4] = f16_bytes(np.full(nb, 0.02 / 2 / 32))
    elif ty == T.Q6_K:
        data[:, 208:210] = f16_bytes(np.full(nb, 0.02 / 32 / 64))
    shape = (rows, (cols // per) * size) if experts is None else (experts, rows, (cols // per) * size)
    return data.reshape(shape)


def dense(rng, shape, around=0.0, spread=0.02):
    return (around + spread * rng.standard_normal(shape)).astype(np.float32)


def gpt_oss_20b(w, rng, n_layer):
    arch = "gpt-oss"
    n_embd, n_head, n_kv, hd, n_exp, n_ff, n_vocab = 2880, 64, 8, 64, 32, 2880, 201088
    w.add_block_count(n_layer)
    w.add_context_length(131072)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(150000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(4)
    w.add_expert_feed_forward_length(n_ff)
    w.add_sliding_window(128)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
    specials = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>",
                200003: "<|constrain|>", 200005: "<|channel|>", 200006: "<|start|>",
                200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>"}
    tokenizer(w, "gpt2", "gpt-4o", n_vocab, specials, bos=199998, eos=200002, pad=199999)
    w.add_tensor("token_embd.weight", quantized(rng, T.Q8_0, n_vocab, n_embd), raw_dtype=T.Q8_0)
    w.add_tensor("output_norm.weight", dense(rng, n_embd, 1.0))
    w.add_tensor("output.weight", quantized(rng, T.Q8_0, n_vocab, n_embd), raw_dtype=T.Q8_0)
    q, kv = n_head * hd, n_kv * hd
    for il in range(n_layer):
        b = f"blk.{il}."
        w.add_tensor(b + "attn_norm.weight", dense(rng, n_embd, 1.0))
        for name, rows, cols in [("attn_q", q, n_embd), ("attn_k", kv, n_embd),
                                 ("attn_v", kv, n_embd), ("attn_output", n_embd, q)]:
            w.add_tensor(b + name + ".weight", quantized(rng, T.Q8_0, rows, cols), raw_dtype=T.Q8_0)
            w.add_tensor(b + name + ".bias", dense(rng, rows))
        w.add_tensor(b + "attn_sinks.weight", dense(rng, n_head))
        w.add_tensor(b + "post_attention_norm.weight", dense(rng, n_embd, 1.0))
        w.add_tensor(b + "ffn_gate_inp.weight", dense(rng, (n_exp, n_embd), spread=0.05))
        w.add_tensor(b + "ffn_gate_inp.bias", dense(rng, n_exp))
        for name, rows, cols in [("ffn_gate_exps", n_ff, n_embd), ("ffn_up_exps", n_ff, n_embd),
                                 ("ffn_down_exps", n_embd, n_ff)]:
            w.add_tensor(b + name + ".weight", quantized(rng, T.MXFP4, rows, cols, n_exp),
                         raw_dtype=T.MXFP4)
            w.add_tensor(b + name + ".bias", dense(rng, (n_exp, rows)))
    return arch


def use_more_bits(i, n):
    """llama.cpp's choice of the layers whose attn_v and ffn_down Q4_K_M keeps in Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def llama_8b(w, rng, n_layer):
    arch = "llama"
    n_embd, n_ff, n_head, n_kv, n_vocab = 4096, 14336, 32, 8, 128256
    w.add_block_count(n_layer)
    w.add_context_length(131072)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_vocab_size(n_vocab)
    specials = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>",
                128006: "<|start_header_id|>", 128007: "<|end_header_id|>", 128009: "<|eot_id|>"}
    tokenizer(w, "gpt2", "llama-bpe", n_vocab, specials, bos=128000, eos=128009, pad=None)
    w.add_tensor("token_embd.weight", quantized(rng, T.Q4_K, n_vocab, n_embd), raw_dtype=T.Q4_K)
    w.add_tensor("output_norm.weight", dense(rng, n_embd, 1.0))
    w.add_tensor("output.weight", quantized(rng, T.Q6_K, n_vocab, n_embd), raw_dtype=T.Q6_K)
    w.add_tensor("rope_freqs.weight", llama31_rope_freqs(n_embd // n_head))
    kv = n_kv * (n_embd // n_head)
    for il in range(n_layer):
        b = f"blk.{il}."
        more = T.Q6_K if use_more_bits(il, n_layer) else T.Q4_K
        w.add_tensor(b + "attn_norm.weight", dense(rng, n_embd, 1.0))
        w.add_tensor(b + "ffn_norm.weight", dense(rng, n_embd, 1.0))
        for name, ty, rows, cols in [("attn_q", T.Q4_K, n_embd, n_embd),
                                     ("attn_k", T.Q4_K, kv, n_embd), ("attn_v", more, kv, n_embd),
                                     ("attn_output", T.Q4_K, n_embd, n_embd),
                                     ("ffn_gate", T.Q4_K, n_ff, n_embd),
                                     ("ffn_up", T.Q4_K, n_ff, n_embd),
                                     ("ffn_down", more, n_embd, n_ff)]:
            w.add_tensor(b + name + ".weight", quantized(rng, ty, rows, cols), raw_dtype=ty)
    return arch


def qwen25_05b(w, rng, n_layer):
    arch = "qwen2"
    n_embd, n_ff, n_head, n_kv, hd, n_vocab = 896, 4864, 14, 2, 64, 151936
    # the layers whose attn_v is Q8_0 and ffn_down Q6_K in the real Q4_K_M file
    more_bits = {0, 1, 3, 6, 7, 8, 9, 10, 13, 16, 19, 21}
    w.add_block_count(n_layer)
    w.add_context_length(32768)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    specials = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}
    tokenizer(w, "gpt2", "qwen2", n_vocab, specials, bos=151643, eos=151645, pad=151643)
    w.add_tensor("token_embd.weight", quantized(rng, T.Q5_0, n_vocab, n_embd), raw_dtype=T.Q5_0)
    w.add_tensor("output_norm.weight", dense(rng, n_embd, 1.0))
    w.add_tensor("output.weight", quantized(rng, T.Q8_0, n_vocab, n_embd), raw_dtype=T.Q8_0)
    q, kv = n_head * hd, n_kv * hd
    for il in range(n_layer):
        b = f"blk.{il}."
        more = il in more_bits
        w.add_tensor(b + "attn_norm.weight", dense(rng, n_embd, 1.0))
        w.add_tensor(b + "ffn_norm.weight", dense(rng, n_embd, 1.0))
        for name, ty, rows, cols in [("attn_q", T.Q5_0, q, n_embd), ("attn_k", T.Q5_0, kv, n_embd),
                                     ("attn_v", T.Q8_0 if more else T.Q5_0, kv, n_embd),
                                     ("attn_output", T.Q5_0, n_embd, q),
                                     ("ffn_gate", T.Q5_0, n_ff, n_embd),
                                     ("ffn_up", T.Q5_0, n_ff, n_embd)]:
            w.add_tensor(b + name + ".weight", quantized(rng, ty, rows, cols), raw_dtype=ty)
            if name in ("attn_q", "attn_k", "attn_v"):
                w.add_tensor(b + name + ".bias", dense(rng, rows))
        down = T.Q6_K if more else T.Q4_K
        w.add_tensor(b + "ffn_down.weight", quantized(rng, down, n_embd, n_ff), raw_dtype=down)
    return arch


def llama31_rope_freqs(head_dim, base=500000.0, factor=8.0, low=1.0, high=4.0, orig=8192):
    """Llama 3.1's per-pair frequency divisors, as convert_hf_to_gguf.py writes `rope_freqs`."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def tokenizer(w, model, pre, n_vocab, specials, bos, eos, pad):
    tokens, types, merges = vocabulary(n_vocab, specials)
    w.add_tokenizer_model(model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    if pad is not None:
        w.add_pad_token_id(pad)
    w.add_add_bos_token(False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shape", choices=["gpt-oss-20b", "llama-8b", "qwen2.5-0.5b"])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-from", metavar="GGUF",
                    help="copy this GGUF's tokenizer (tokenizer_gguf.py makes a small one) "
                         "instead of the synthetic vocabulary; its size must be the shape's")
    a = ap.parse_args()
    if a.tokenizer_from:
        global tokenizer
        source = gguf.GGUFReader(a.tokenizer_from)
        n_tokens = len(source.fields["tokenizer.ggml.tokens"].contents())

        def tokenizer(w, model, pre, n_vocab, specials, bos, eos, pad):  # noqa: F811
            if n_tokens != n_vocab:
                sys.exit(f"{a.tokenizer_from}: {n_tokens} tokens, the shape has {n_vocab}")
            from tokenizer_gguf import copy_tokenizer
            copy_tokenizer(source, w)
    rng = np.random.default_rng(a.seed)
    arch, build, layers = {
        "gpt-oss-20b": ("gpt-oss", gpt_oss_20b, 24),
        "llama-8b": ("llama", llama_8b, 32),
        "qwen2.5-0.5b": ("qwen2", qwen25_05b, 24),
    }[a.shape]
    w = gguf.GGUFWriter(a.out, arch)
    w.add_name(f"shaped {a.shape} (random values)")
    build(w, rng, a.layers or layers)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()


if __name__ == "__main__":
    main()
