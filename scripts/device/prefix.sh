#!/usr/bin/env bash
# On the device: issue #27's prefix-caching figures over HTTP. `octoflow serve` on a shaped
# qwen2.5-0.5b file (random weights, real shapes; plain completions) with the prefix cache and
# with --no-prefix-cache, each driven by scripts/bench/prefix_http.py: a ~2,000-token shared
# prompt with 64 questions at once (TTFT, total), and a 10-turn conversation (what each turn
# prefilled). Needs ~/dev set up and a fresh `octoflow` in ~/dev/.dev; run from the checkout.
# Output under $OUT.
set -uo pipefail
repo=$PWD
mkdir -p ~/models
m=~/models/qwen2.5-0.5b-shaped.gguf
[ -s $m ] || PYTHONPATH=~/lc/gguf-py python3 "$repo/scripts/models/shaped_gguf.py" qwen2.5-0.5b $m
cd ~/dev/.dev && cp -r ~/dev/.gl . 2>/dev/null; source ./setup.sh >/dev/null 2>&1
bench=$repo/scripts/bench/prefix_http.py
for mode in cache no-cache; do
  flag=""; [ $mode = no-cache ] && flag=--no-prefix-cache
  ./octoflow serve -m $m --instances 64 -c 4096 --max-rows 512 --queue 256 --port 8199 $flag \
    > $OUT/serve-$mode.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do
    curl -sf http://127.0.0.1:8199/health > /dev/null 2>&1 && break
    sleep 1
  done
  echo "#### $mode"
  python3 $bench --url http://127.0.0.1:8199 --system-words 800 --max-tokens 32 shared --questions 64
  python3 $bench --url http://127.0.0.1:8199 --system-words 800 --max-tokens 32 chat --turns 10
  curl -s http://127.0.0.1:8199/metrics | grep -E "prefix|kv_" || true
  kill -INT $pid; wait $pid
done 2>&1 | tee $OUT/prefix.log
