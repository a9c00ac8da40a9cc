#!/usr/bin/env python3
"""Mean NLL (nats/token) of a text's first N tokens under llama.cpp (llama-cpp-python), with an
optional LoRA adapter GGUF: the quantity `octoflow perplexity --json` reports as mean_nll.
Usage: llama_nll.py MODEL.gguf TEXT_FILE [--lora ADAPTER.gguf] [--tokens N]"""
import argparse
import json
import math

import numpy as np
from llama_cpp import Llama

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("text")
ap.add_argument("--lora")
ap.add_argument("--tokens", type=int, default=512)
a = ap.parse_args()
llm = Llama(model_path=a.model, lora_path=a.lora, n_ctx=a.tokens + 8, logits_all=True, verbose=False)
ids = llm.tokenize(open(a.text, "rb").read(), add_bos=True)[: a.tokens]
llm.eval(ids)
scores = np.array(llm.scores[: len(ids)], dtype=np.float64)
nll = []
for t in range(1, len(ids)):
    row = scores[t - 1]
    m = row.max()
    nll.append(m + math.log(np.exp(row - m).sum()) - row[ids[t]])
print(json.dumps({"n_tokens": len(ids), "mean_nll": sum(nll) / len(nll)}))
