#!/usr/bin/env python3
"""llama.cpp's (llama-cpp-python's) tokenizer, detokenizer and chat-template rendering, for the
differential tests in crates/octoflow-text/tests/llama_cpp.rs.
Usage: llama_text.py MODEL.gguf < request.json > answer.json
request: {"texts": [str], "ids": [[int]], "conversations": [{"messages": [{"role", "content"}],
          "add_generation_prompt": bool, "kwargs": {more template variables} (optional)}],
          "eog": bool (optional)}
answer:  {"special": [[int]]  (no BOS, special tokens parsed),
          "bos_plain": [[int]] (BOS/EOS as the model adds them, special-token text as plain text),
          "decoded": [str]  (detokenized without special tokens, invalid UTF-8 as U+FFFD),
          "rendered": [str] or null when the model has no chat template,
          "eog": [int] (with "eog": true: the ids that end generation)}
Chat templates are rendered the way llama-cpp-python's Jinja2ChatFormatter renders them (Jinja2,
trim_blocks and lstrip_blocks), the way the golden files' chat prompts were made."""
import ctypes
import json
import sys

import llama_cpp
from llama_cpp import Llama
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

req = json.load(sys.stdin)
llm = Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)


def tok(text, add_bos, special):
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)


def detok(ids):
    # llama.cpp's own llama_detokenize (Llama.detokenize reads each piece into 32 bytes and
    # drops a space after BOS): special tokens neither removed nor written out.
    arr = (llama_cpp.llama_token * len(ids))(*ids)
    size = 64 + 256 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(llm._model.vocab, arr, len(ids), buf, size, False, False)
    assert 0 <= n <= size, n
    return buf.raw[:n].decode("utf-8", errors="replace")


answer = {
    "special": [tok(t, False, True) for t in req["texts"]],
    "bos_plain": [tok(t, True, False) for t in req["texts"]],
    "decoded": [detok(ids) for ids in req["ids"]],
    "rendered": None,
}
if req.get("eog"):
    vocab = llm._model.vocab
    answer["eog"] = [i for i in range(llama_cpp.llama_vocab_n_tokens(vocab))
                     if llama_cpp.llama_vocab_is_eog(vocab, i)]
template = llm.metadata.get("tokenizer.chat_template")
if template:
    eos = llm._model.token_get_text(llm.token_eos())
    bos = llm._model.token_get_text(llm.token_bos())
    env = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)._environment

    def fail(message):
        raise ValueError(message)

    answer["rendered"] = [
        env.render(
            messages=c["messages"],
            add_generation_prompt=c["add_generation_prompt"],
            eos_token=eos,
            bos_token=bos,
            raise_exception=fail,
            functions=None,
            function_call=None,
            tool_choice=None,
            strftime_now=Jinja2ChatFormatter.strftime_now,
            **{"tools": None, **c.get("kwargs", {})},
        )
        for c in req["conversations"]
    ]
json.dump(answer, sys.stdout)
