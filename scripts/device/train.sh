#!/usr/bin/env bash
# Runs on the device from the checkout copy (~/dev holds the packed binaries, ~/models the
# models). `train.sh check`: the training step's GPU tests, the qwen training profile and
# throughput at seq 512 × batch 4 (rank 16, all seven targets). `train.sh pirate`: the pirate
# fine-tune, then held-out prompts answered by the adapted and the base model. Output in $OUT.
repo=$PWD
cd ~/dev && source ./setup.sh >/dev/null 2>&1
Q=qwen2.5-coder-0.5b-instruct-q4_k_m
D=$repo/data/pirate
if [ "$1" = check ]; then
  { echo "== gradients"; timeout 120 ./gradients --test-threads 1 --nocapture 2>&1 | grep -E "panicked|test result|loss"; } | tee $OUT/tests.log
  timeout 150 ./octoflow train -m $Q --data $D/train.jsonl -o /tmp/prof --seq-len 512 --batch 4 --profile 2>&1 | head -40 | tee $OUT/profile.log
  timeout 200 ./octoflow train -m $Q --data $D/train.jsonl -o /tmp/bench --seq-len 512 --batch 4 --max-steps 6 --save-every 0 --quiet 2>&1 | tail -10 | tee $OUT/bench.log
else
  timeout 400 ./octoflow train -m $Q --data $D/train.jsonl --eval $D/eval.jsonl -o ~/pirate --seq-len 256 --batch 4 --epochs 2 --lr 5e-4 --warmup 5 --eval-every 10 --save-every 0 --quiet 2>&1 | tail -80 | tee $OUT/pirate.log
  cp ~/pirate/log.jsonl $OUT/pirate-log.jsonl 2>/dev/null
  n=0
  while IFS= read -r p; do
    n=$((n+1))
    echo "### $p"
    echo "--- lora:"; timeout 30 ./octoflow run -m $Q --chat-prompt --temp 0 -n 32 -p "$p" --lora ~/pirate 2>/dev/null
    if [ $n -le 6 ]; then echo; echo "--- base:"; timeout 30 ./octoflow run -m $Q --chat-prompt --temp 0 -n 32 -p "$p" 2>/dev/null; fi
    echo
  done < $D/heldout.txt > $OUT/heldout.log 2>&1
  tail -40 $OUT/heldout.log
fi
