#!/usr/bin/env bash
# On the device, in one call (a background build does not outlive its call): issue #27's
# long-context figures for OctoFlow and llama.cpp CUDA on the same shaped files — pp512 and
# tg128 at depth 0 and 8,192 per KV cache type, and pp32000 on the qwen shape.
#   depth.sh [TYPES]   TYPES: cache types, default "f16 q8_0"
# Needs ~/dev set up (.pk/dev.tar.xz unpacked, .gl copied into .dev), the pruned llama.cpp
# sources in ~/lc and `octoflow` in ~/dev/.dev. The llama.cpp build runs while OctoFlow's tests
# run (its CPU load does not reach the GPU-bound benchmarks), then llama-bench runs alone.
# Output under $OUT. Run from the checkout (the call's working directory).
set -uo pipefail
repo=$PWD
types=(${1:-f16 q8_0})
(cd ~/lc && cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j14 --target llama-bench) \
  > "$OUT/llama-build.log" 2>&1 &
build=$!
mkdir -p ~/models
for s in qwen2.5-0.5b llama-8b; do
  [ -s ~/models/$s-shaped.gguf ] ||
    PYTHONPATH=~/lc/gguf-py python3 "$repo/scripts/models/shaped_gguf.py" $s ~/models/$s-shaped.gguf
done
cd ~/dev/.dev && cp -r ~/dev/.gl . 2>/dev/null; source ./setup.sh >/dev/null 2>&1
for s in qwen2.5-0.5b llama-8b; do
  m=~/models/$s-shaped.gguf
  for kv in "${types[@]}"; do
    echo "== $s octoflow $kv"
    timeout 150 ./octoflow bench -m $m -p 512 -n 128 -d 0,8192 -r 2 --cache-type $kv 2>&1 |
      grep -E "memory|pp|tg|rror"
  done
done 2>&1 | tee "$OUT/depth-octoflow.log"
echo "== qwen2.5-0.5b octoflow pp32000" | tee -a "$OUT/depth-octoflow.log"
timeout 120 ./octoflow bench -m ~/models/qwen2.5-0.5b-shaped.gguf -p 32000 -n 0 -r 1 2>&1 |
  grep -E "pp|rror" | tee -a "$OUT/depth-octoflow.log"
wait $build
echo "llama.cpp build rc=$?" | tee -a "$OUT/llama-build.log"
lb=~/lc/build/bin/llama-bench
for s in qwen2.5-0.5b llama-8b; do
  m=~/models/$s-shaped.gguf
  for kv in "${types[@]}"; do
    echo "== $s llama.cpp $kv"
    timeout 150 $lb -m $m -ngl 99 -fa 1 -p 512 -n 128 -d 0,8192 -r 2 -ctk $kv -ctv $kv 2>&1 |
      grep -E "pp|tg|rror"
  done
done 2>&1 | tee "$OUT/depth-llama.log"
echo "== qwen2.5-0.5b llama.cpp pp32000" | tee -a "$OUT/depth-llama.log"
timeout 120 $lb -m ~/models/qwen2.5-0.5b-shaped.gguf -ngl 99 -fa 1 -p 32000 -n 0 -r 1 2>&1 |
  grep -E "pp|rror" | tee -a "$OUT/depth-llama.log"
