#!/usr/bin/env python3
"""llama.cpp's (llama-cpp-python's, CPU backend) view of a model, for the architecture
differential test in crates/octoflow/tests/llama_cpp_arch.rs.

Usage: llama_logits.py MODEL.gguf < request.json > answer.json
request: {"ids": [id, ...], "greedy": [[prompt id, ...], ...], "n": N}
answer:  {"logits": [n_ids][n_vocab] floats, every position of "ids";
          "greedy": per prompt, N steps of {"token": argmax, "margin": top-1 minus top-2 logit}}"""
import json
import os
import sys

import numpy as np
from llama_cpp import Llama

req = json.load(sys.stdin)
ids = req["ids"]
prompts = req.get("greedy", [])
n = int(req.get("n", 0))
longest = max([len(ids)] + [len(p) + n for p in prompts])
llm = Llama(model_path=sys.argv[1], n_ctx=max(64, longest), n_batch=max(64, longest),
            logits_all=True, n_threads=2, verbose=os.environ.get("LLAMA_VERBOSE", "0") == "1")
llm.eval(ids)
out = {"logits": llm.scores[: len(ids)].tolist(), "greedy": []}
for p in prompts:
    llm.reset()
    llm.eval(p)
    steps = []
    for _ in range(n):
        last = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        order = np.argsort(-last, kind="stable")
        tok = int(order[0])
        steps.append({"token": tok, "margin": float(last[order[0]] - last[order[1]])})
        llm.eval([tok])
    out["greedy"].append(steps)
json.dump(out, sys.stdout)
