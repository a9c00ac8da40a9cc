#!/usr/bin/env bash
# Runs on the device: every GPU test binary (one test thread: NVIDIA serializes poorly across
# parallel contexts in one process), the benchmarks and the warm-start measurement; output
# under $OUT.
cd "$(dirname "$0")"
cp -r ~/dev/.gl . 2>/dev/null; source ./setup.sh >/dev/null 2>&1
# test binaries look for golden files and test data under the checkout they were built in
root=$(cat build_root)
if [ ! -e "$root" ]; then mkdir -p "$(dirname "$root")"; ln -sfn "$REPO" "$root"; fi
{
  for t in octoflow_vk octoflow_kernels octoflow_model gpu_chain gpu_batch gradients shared_model; do
    echo "== $t"; timeout 300 ./$t --test-threads 1 2>&1 | grep -E "FAILED|panicked|test result|max \|"
  done
  echo "== gpu_agreement"
  timeout 300 ./gpu_agreement --nocapture --test-threads 1 2>&1 | grep -E "panicked|test result|NLL|prompts agree|max\|dlogit"
} 2>&1 | tee $OUT/tests.log
for m in qwen2.5-coder-0.5b-instruct-q4_k_m smollm2-135m-instruct-q4_1 gemma-3-270m-q4_k_m; do
  timeout 120 ./octoflow bench -m $m -p 512 -n 128 -r 3 --steps 16 2>&1 | grep -E "Vulkan|error"
done | tee $OUT/bench.log
timeout 120 ./octoflow bench -m qwen2.5-coder-0.5b-instruct-q4_k_m --streams 1,8,32,128 2>&1 | tail -8 | tee -a $OUT/bench.log
# warm start: a first start without the pipeline cache, then a second start with it
for how in --cold ""; do
  timeout 300 python3 warm_start.py --bin ./octoflow -m qwen2.5-coder-0.5b-instruct-q4_k_m $how 2>&1
  timeout 120 ./octoflow run -m qwen2.5-coder-0.5b-instruct-q4_k_m -p "Hello" -n 8 --temp 0 2>&1 | grep -E "warm-up|eval"
done | tee $OUT/warm.log
