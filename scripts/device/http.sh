#!/usr/bin/env bash
# On the device: issue #27's "HTTP path at engine speed" and structured output's cost. The
# engine alone (`octoflow bench --streams 8,32,128`, 128 prompt and 128 generated tokens a
# stream) and `octoflow serve` under scripts/bench/serve_load.py (-n 128, ignore_eos) at 8, 32
# and 128 concurrent requests, then 32 with every output held to a JSON schema. The shaped
# qwen2.5-0.5b file (random weights, real shapes); with an argument, a tokenizer GGUF
# (scripts/models/tokenizer_gguf.py) whose vocabulary the shaped file takes instead of the
# synthetic one (the grammar's masks then cost what they cost for the real model). Needs ~/dev
# set up and a fresh `octoflow` in ~/dev/.dev; run from the checkout. Output under $OUT.
#   http.sh [TOKENIZER.gguf]
set -uo pipefail
repo=$PWD
mkdir -p ~/models
if [ $# -gt 0 ]; then
  m=~/models/qwen2.5-0.5b-shaped-tok.gguf
  [ -s $m ] || PYTHONPATH=~/lc/gguf-py python3 "$repo/scripts/models/shaped_gguf.py" \
    qwen2.5-0.5b $m --tokenizer-from "$1"
else
  m=~/models/qwen2.5-0.5b-shaped.gguf
  [ -s $m ] || PYTHONPATH=~/lc/gguf-py python3 "$repo/scripts/models/shaped_gguf.py" qwen2.5-0.5b $m
fi
cd ~/dev/.dev && cp -r ~/dev/.gl . 2>/dev/null; source ./setup.sh >/dev/null 2>&1
cp $repo/scripts/bench/serve_load.py $repo/scripts/bench/agents_http.py .
{
  echo "#### engine"
  timeout 120 ./octoflow bench -m $m --streams 8,32,128 2>&1 | grep -E "^\||rror"
  ./octoflow serve -m $m --instances 128 -c 1024 --max-rows 512 --queue 1024 --port 8199 \
    > $OUT/serve.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do
    curl -sf http://127.0.0.1:8199/health > /dev/null 2>&1 && break
    sleep 1
  done
  echo "#### serve"
  for c in 8 32 128; do
    python3 serve_load.py --url http://127.0.0.1:8199 --concurrency $c --duration 20 -n 128
  done
  python3 serve_load.py --url http://127.0.0.1:8199 --concurrency 32 --duration 20 -n 128 --schema
  kill -INT $pid; wait $pid
} 2>&1 | tee $OUT/http.log
