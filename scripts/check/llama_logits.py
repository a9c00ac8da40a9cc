#!/usr/bin/env python3
"""llama.cpp's (llama-cpp-python's) logits for every position of a token sequence, for the
architecture differential test in crates/octoflow/tests/llama_cpp_arch.rs.
Usage: llama_logits.py MODEL.gguf ID,ID,... > logits.json   ([n_ids][n_vocab] floats, CPU backend)"""
import json
import sys

from llama_cpp import Llama

ids = [int(t) for t in sys.argv[2].split(",")]
llm = Llama(model_path=sys.argv[1], n_ctx=max(64, len(ids)), n_batch=len(ids),
            logits_all=True, n_threads=2, verbose=bool(int(__import__("os").environ.get("LLAMA_VERBOSE", "0"))))
llm.eval(ids)
json.dump(llm.scores[: len(ids)].tolist(), sys.stdout)
