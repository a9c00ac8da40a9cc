#!/usr/bin/env bash
# Runs on the device from the checkout copy (~/dev holds the packed binaries, ~/models the
# models): issue #8's H100 numbers. `lora.sh check`: the adapter kernels' and the on-the-fly
# adapters' GPU tests. `lora.sh bench`: the pirate fine-tune exported as a llama.cpp adapter and
# applied on the fly (held-out prompts), decode/prefill and batched-stream throughput with and
# without adapters; then (also `lora.sh multi` alone) two fine-tunes trained one after the other vs
# concurrently. Output in $OUT.
repo=$PWD
cd ~/dev && source ./setup.sh >/dev/null 2>&1
Q=qwen2.5-coder-0.5b-instruct-q4_k_m
D=$repo/data/pirate
if [ "$1" = check ]; then
  {
    echo "== kernels lora"; timeout 120 ./octoflow_kernels lora --test-threads 1 2>&1 | grep -E "panicked|test result"
    echo "== model adapters"; timeout 120 ./octoflow_model adapters --test-threads 1 2>&1 | grep -E "panicked|test result|err"
    echo "== gradients"; timeout 120 ./gradients --test-threads 1 2>&1 | grep -E "panicked|test result"
  } 2>&1 | tee $OUT/tests.log
  exit 0
fi
if [ "$1" = bench ]; then
# the pirate adapter, exported in llama.cpp's format and applied on the fly
timeout 200 ./octoflow train -m $Q --data $D/train.jsonl --eval $D/eval.jsonl -o ~/pirate --seq-len 256 --batch 4 --epochs 2 --lr 5e-4 --warmup 5 --eval-every 0 --save-every 0 --quiet 2>&1 | tail -6 | tee $OUT/pirate.log
./octoflow export --lora ~/pirate -m $Q -o ~/pirate.gguf 2>&1 | tee -a $OUT/pirate.log
n=0
while IFS= read -r p && [ $n -lt 8 ]; do
  n=$((n+1))
  echo "### $p"; timeout 30 ./octoflow run -m $Q --chat-prompt --temp 0 -n 24 -p "$p" --lora ~/pirate.gguf 2>/dev/null; echo
done < $D/heldout.txt > $OUT/heldout.log 2>&1
grep -c "^Arr" $OUT/heldout.log | sed 's/^/held-out answers starting with Arr: /' | tee -a $OUT/pirate.log
# throughput with and without adapters
{
  echo "== base"; timeout 120 ./octoflow bench -m $Q -p 512 -n 128 -r 3 2>&1 | tail -4
  echo "== + pirate.gguf on the fly"; timeout 120 ./octoflow bench -m $Q -p 512 -n 128 -r 3 --lora ~/pirate.gguf 2>&1 | tail -4
  echo "== streams base"; timeout 120 ./octoflow bench -m $Q --streams 1,8,32,64 2>&1 | tail -7
  echo "== streams, two adapters mixed (stream s: adapter s mod 2)"; timeout 120 ./octoflow bench -m $Q --streams 1,8,32,64 --lora ~/pirate.gguf --lora-scaled ~/pirate.gguf 0.5 2>&1 | tail -7
} 2>&1 | tee $OUT/bench.log
fi
# two fine-tunes: one after the other, then concurrently over one copy of the base
mkdir -p /tmp/cfg
cat > /tmp/cfg/a.toml <<T
data = "$D/train.jsonl"
output = "/tmp/runs/a"
rank = 16
lr = 5e-4
seq_len = 512
batch = 4
max_steps = 12
save_every = 0
T
cat > /tmp/cfg/b.toml <<T
data = "$D/train.jsonl"
output = "/tmp/runs/b"
rank = 8
lr = 2e-4
seed = 7
seq_len = 512
batch = 4
max_steps = 12
save_every = 0
T
{
  for c in a b; do
    rm -rf /tmp/runs; echo "== $c alone"; t0=$(date +%s.%N)
    timeout 200 ./octoflow train -m $Q --config /tmp/cfg/$c.toml --quiet 2>&1 | tail -6
    echo "wall $(awk "BEGIN{print $(date +%s.%N) - $t0}") s"
  done
  rm -rf /tmp/runs; echo "== a + b concurrently"; t0=$(date +%s.%N)
  timeout 300 ./octoflow train -m $Q --config /tmp/cfg/a.toml --config /tmp/cfg/b.toml --quiet 2>&1 | tail -12
  echo "wall $(awk "BEGIN{print $(date +%s.%N) - $t0}") s"
} 2>&1 | tee $OUT/multi.log
