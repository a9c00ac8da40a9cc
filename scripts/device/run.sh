#!/usr/bin/env bash
# Runs on the device: every GPU test binary (one test thread: NVIDIA serializes poorly across
# parallel contexts in one process) and the benchmarks; output under $OUT.
cd "$(dirname "$0")"
cp -r ~/dev/.gl . 2>/dev/null; source ./setup.sh >/dev/null 2>&1
{
  for t in octoflow_vk octoflow_kernels gpu_chain; do
    echo "== $t"; timeout 200 ./$t --test-threads 1 2>&1 | grep -E "FAILED|panicked|test result|max \|"
  done
  echo "== gpu_agreement"
  timeout 200 ./gpu_agreement --nocapture --test-threads 1 2>&1 | grep -E "panicked|test result|NLL|prompts agree|max\|dlogit"
} 2>&1 | tee $OUT/tests.log
for m in qwen2.5-coder-0.5b-instruct-q4_k_m smollm2-135m-instruct-q4_1 gemma-3-270m-q4_k_m; do
  timeout 120 ./octoflow bench -m $m -p 512 -n 128 -r 3 --steps 16 2>&1 | grep -E "Vulkan|error"
done | tee $OUT/bench.log
timeout 60 ./octoflow bench -m qwen2.5-coder-0.5b-instruct-q4_k_m -p 512 -n 128 -r 1 --profile 2>&1 | head -40 > $OUT/prof.log
timeout 60 ./octoflow run -m smollm2-135m-instruct-q4_1 -p "The capital of France is" -n 24 --temp 0 2>&1 | tail -4 >> $OUT/prof.log
