#!/usr/bin/env bash
# Runs on the device: the agent VM's workloads (docs/PERFORMANCE.md, "Agents") through
# `octoflow agents` for each binary given, then the same workloads through `octoflow serve` +
# scripts/bench/agents_http.py (the first binary's server). Output under $OUT.
#   bash agents.sh ./octoflow [./octoflow-old ...]
set -u
cd "$(dirname "$0")"
M=${M:-smollm2-135m-instruct-q4_1}
python3 - <<'PY'
import json
with open("q256.jsonl", "w") as f:
    for i in range(256):
        f.write(json.dumps({"id": i, "prompt": "Summarize: the sea is " + "blue and deep " * (1 + i % 7)}) + "\n")
with open("q2000.jsonl", "w") as f:
    for i in range(2000):
        f.write(json.dumps({"id": i, "prompt": "Summarize: the sea is " + "blue and deep " * (1 + i % 7)}) + "\n")
chat = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
qs = ["Is {} a prime number?", "What is {} times 3?", "Name a city with {} letters.", "Is {} even or odd?"]
with open("debate16.jsonl", "w") as f:
    for i in range(16):
        f.write(json.dumps({"id": i, "prompt": chat.format(qs[i % 4].format(7 + i))}) + "\n")
PY
run() { # label, then octoflow agents arguments
  local label=$1; shift
  echo "== $label"
  timeout 300 "$@" 2>&1 | grep -E "octoflow agents: |error|Error" | tail -3
}
prun() { # label, then octoflow agents arguments: with --profile, the kernels' table
  local label=$1; shift
  echo "== $label (--profile)"
  timeout 300 "$@" --profile 2>&1 | grep -vE "^\s*$" | grep -E "GPU time|^kernel|^(vm|rows)|floor|octoflow agents: |error|Error" | head -${TOP:-40}
}
for bin in "$@"; do
  echo "#### $bin"
  run "queue 256x256 -c 512 --steps 32" $bin agents -m $M --pattern queue --tasks q256.jsonl --instances 256 -n 64 --temp 0 -c 512 --steps 32 -o $OUT/q256.$(basename $bin).jsonl
  run "queue 256x256 again (warm)" $bin agents -m $M --pattern queue --tasks q256.jsonl --instances 256 -n 64 --temp 0 -c 512 --steps 32 -o $OUT/q256b.$(basename $bin).jsonl
  run "queue 2000 tasks x 256 instances -c 512 --steps 32" $bin agents -m $M --pattern queue --tasks q2000.jsonl --instances 256 -n 64 --temp 0 -c 512 --steps 32 -o $OUT/q2000x256.$(basename $bin).jsonl
  run "queue 2000 tasks x 1000 instances -c 256 --steps 32" $bin agents -m $M --pattern queue --tasks q2000.jsonl --instances 1000 -n 64 --temp 0 -c 256 --steps 32 -o $OUT/q2000.$(basename $bin).jsonl
  run "debate 16 x 3 x 2 rounds -c 1024 --steps 32" $bin agents -m $M --pattern debate --tasks debate16.jsonl --instances 3 --rounds 2 -n 64 --temp 0 -c 1024 --steps 32 -o $OUT/debate.$(basename $bin).jsonl
  run "debate 16 x 3 x 2 rounds -c 1024 host (--steps 0)" $bin agents -m $M --pattern debate --tasks debate16.jsonl --instances 3 --rounds 2 -n 64 --temp 0 -c 1024 --steps 0 -o $OUT/debate0.$(basename $bin).jsonl
  prun "queue 256x256" $bin agents -m $M --pattern queue --tasks q256.jsonl --instances 256 -n 64 --temp 0 -c 512 --steps 32 -o $OUT/q256p.$(basename $bin).jsonl
  prun "debate 16 x 3 x 2" $bin agents -m $M --pattern debate --tasks debate16.jsonl --instances 3 --rounds 2 -n 64 --temp 0 -c 1024 --steps 32 -o $OUT/debatep.$(basename $bin).jsonl
done
bin=$1
echo "#### serve + asyncio ($bin)"
$bin serve -m $M --instances 256 -c 1024 --max-rows 512 --queue 4096 --port 8199 > $OUT/serve.log 2>&1 &
pid=$!
for _ in $(seq 120); do curl -sf http://127.0.0.1:8199/health >/dev/null && break; sleep 0.5; done
for c in 256; do
  echo "== http queue 256 tasks, concurrency $c"; python3 agents_http.py --url http://127.0.0.1:8199 --tasks q256.jsonl --concurrency $c -n 64 queue
  echo "== http queue 2000 tasks, concurrency $c"; python3 agents_http.py --url http://127.0.0.1:8199 --tasks q2000.jsonl --concurrency $c -n 64 queue
done
echo "== http queue 2000 tasks, concurrency 1000 (serve has 256 instances)"; python3 agents_http.py --url http://127.0.0.1:8199 --tasks q2000.jsonl --concurrency 1000 -n 64 queue
echo "== http debate 16, one task at a time"; python3 agents_http.py --url http://127.0.0.1:8199 --tasks debate16.jsonl --concurrency 1 -n 64 debate --instances 3 --rounds 2
kill $pid; wait $pid 2>/dev/null
