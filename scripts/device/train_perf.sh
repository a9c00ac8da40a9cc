#!/usr/bin/env bash
# On the device: issue #29's training figures. The training step's GPU tests, then the QLoRA
# profile and throughput at seq 512 × batch 4 (rank 16, all seven targets) on a shaped
# qwen2.5-0.5b file (random weights, the real layout and tokenizer: the pirate data's chat turns
# render) for the previous binary (~/tbx/octoflow.old) and this one, and the PEFT peer
# (scripts/bench/peft_train.py) on the same machine. Needs ~/dev set up, ~/tbx unpacked and
# ~/tok/qwen-tok.gguf; run from the checkout. Output under $OUT. BINS overrides the binaries
# compared; PEFT=0 skips the peer.
set -uo pipefail
repo=$PWD
mkdir -p ~/models
m=~/models/qwen2.5-0.5b-tok.gguf
[ -s $m ] || PYTHONPATH=~/lc/gguf-py:$repo/scripts/models python3 "$repo/scripts/models/shaped_gguf.py" \
  qwen2.5-0.5b $m --tokenizer-from ~/tok/qwen-tok.gguf
cd ~/dev/.dev && cp -r ~/dev/.gl . 2>/dev/null; source ./setup.sh >/dev/null 2>&1
D=$repo/data/pirate
{ for t in gradients cpu_gradients; do
    echo "== $t"
    timeout 200 ~/tbx/$t --test-threads 1 --nocapture 2>&1 | grep -E "panicked|test result|transposed|loss"
  done; } | tee $OUT/tests.log
for bin in ${BINS:-$HOME/tbx/octoflow.old $HOME/tbx/octoflow}; do
  echo "#### $bin"
  timeout 150 $bin train -m $m --data $D/train.jsonl -o /tmp/prof --seq-len 512 --batch 4 --profile 2>&1 | head -32
  timeout 200 $bin train -m $m --data $D/train.jsonl -o /tmp/bench --seq-len 512 --batch 4 \
    --max-steps 6 --save-every 0 --quiet 2>&1 | tail -9
done 2>&1 | tee $OUT/train.log
[ "${PEFT:-1}" = 0 ] || timeout 300 python3 "$repo/scripts/bench/peft_train.py" --batch 4 --seq 512 2>&1 | tail -3 | tee $OUT/peft.log
