#!/usr/bin/env bash
# On the device: batches of a few rows on 8-bit dot products against the previous path
# (cooperative matrices with split-K), each pair in one call: `octoflow bench --streams` on the
# qwen2.5-0.5b and llama-8b shaped files with OCTOFLOW_DOT_BATCHES=0 (no dot batches) then 1, the
# 8-stream step's profile on the dot path, and `octoflow serve` under serve_load.py at 8
# concurrent streams both ways; first, where ~/dev/.dev holds `octoflow_kernels_bench` (the
# kernels' test binary built with `--release --features bench`), the kernel-level comparison
# `dot_batch_layouts` (benches/dot_bench.rs). Needs ~/dev set up (setup.sh sourced: the Vulkan
# loader and NVIDIA ICD) with a fresh `octoflow` in ~/dev/.dev and gguf-py importable; run
# from the checkout. Output under $OUT.
#   dot.sh
set -uo pipefail
repo=$PWD
mkdir -p ~/models
q=~/models/qwen2.5-0.5b-shaped.gguf
l=~/models/llama-8b-shaped.gguf
[ -s $q ] || python3 "$repo/scripts/models/shaped_gguf.py" qwen2.5-0.5b $q
[ -s $l ] || python3 "$repo/scripts/models/shaped_gguf.py" llama-8b $l
cd ~/dev/.dev && cp "$repo/scripts/bench/serve_load.py" "$repo/scripts/bench/agents_http.py" .
{
  if [ -x ./octoflow_kernels_bench ]; then
    echo "#### dot_batch_layouts"
    timeout 300 ./octoflow_kernels_bench dot_batch_layouts --ignored --nocapture --test-threads 1
  fi
  for m in $q $l; do
    for d in 0 1; do
      echo "#### $(basename $m) OCTOFLOW_DOT_BATCHES=$d"
      OCTOFLOW_DOT_BATCHES=$d timeout 120 ./octoflow bench -m $m --streams 1,2,4,8,16 2>&1 |
        grep -E "^\||rror"
    done
    for o in 0 1; do
      echo "#### $(basename $m) OCTOFLOW_QUANTIZE_ONCE=$o: tg128 and 8 streams"
      OCTOFLOW_QUANTIZE_ONCE=$o timeout 60 ./octoflow bench -m $m -p 0 -n 128 -r 2 2>&1 |
        grep -E "\| *tg|rror"
      OCTOFLOW_QUANTIZE_ONCE=$o timeout 60 ./octoflow bench -m $m --streams 8 2>&1 | grep -E "^\||rror"
    done
    echo "#### $(basename $m) 8 streams, --profile"
    OCTOFLOW_DOT_BATCHES=1 timeout 120 ./octoflow bench -m $m --streams 8 --profile 2>&1 | grep -vE "^\s*$" | head -40
  done
  for d in 0 1; do
    OCTOFLOW_DOT_BATCHES=$d ./octoflow serve -m $q --instances 128 -c 1024 --max-rows 512 \
      --queue 1024 --port 8199 > $OUT/serve$d.log 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do
      curl -sf http://127.0.0.1:8199/health > /dev/null 2>&1 && break
      sleep 0.5
    done
    echo "#### serve, OCTOFLOW_DOT_BATCHES=$d"
    python3 serve_load.py --url http://127.0.0.1:8199 --concurrency 8 --duration 15 -n 128
    kill -INT $pid
    wait $pid
  done
} 2>&1 | tee $OUT/dot.log
