#!/usr/bin/env bash
# Runs on the device (from ~/dev after the models are joined in ~/models): the kernel tests that
# changed, the model agreement tests, then `octoflow bench` (pp512/tg128 with the clock warm-up,
# the qwen profile, batched streams); output under $OUT.
cd "$(dirname "$0")"
cp -r ~/dev/.gl . 2>/dev/null; source ./setup.sh >/dev/null 2>&1
{
  for t in octoflow_kernels octoflow_model gpu_chain gpu_batch; do
    echo "== $t"; timeout 200 ./$t --test-threads 1 2>&1 | grep -E "FAILED|panicked|test result"
  done
  echo "== gpu_agreement"
  timeout 200 ./gpu_agreement --nocapture --test-threads 1 2>&1 | grep -E "panicked|test result|NLL|prompts agree"
} 2>&1 | tee $OUT/tests.log
for m in qwen2.5-coder-0.5b-instruct-q4_k_m smollm2-135m-instruct-q4_1 gemma-3-270m-q4_k_m; do
  timeout 120 ./octoflow bench -m $m -p 512 -n 128 -r 3 2>&1 | grep -E "Vulkan|error|device memory|\| *(pp|tg)"
done | tee $OUT/bench.log
timeout 60 ./octoflow bench -m qwen2.5-coder-0.5b-instruct-q4_k_m -p 512 -n 128 -r 1 --profile > $OUT/prof.log 2>&1
timeout 120 ./octoflow bench -m qwen2.5-coder-0.5b-instruct-q4_k_m --streams 1,8,32,64,128 2>&1 | tee $OUT/streams.log | tail -8
