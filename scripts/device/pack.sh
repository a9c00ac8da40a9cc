#!/usr/bin/env bash
# Here: collects the binaries and scripts the device needs into .dev/ (run from the repo root
# after `cargo test --workspace --no-run` and `cargo build -p octoflow`).
set -euo pipefail
mkdir -p .dev
grep -qxF "/.dev/" .git/info/exclude || echo "/.dev/" >> .git/info/exclude
for t in octoflow_vk octoflow_kernels octoflow_model gpu_chain gpu_batch gpu_agreement gradients shared_model; do
  bin=$(ls -t target/debug/deps/$t-* | grep -v '\.d$' | head -1)
  strip -o ".dev/$t" "$bin"
done
strip -o .dev/octoflow target/debug/octoflow
cp scripts/device/run.sh scripts/device/train.sh scripts/device/lora.sh scripts/device/setup.sh .dev/
du -sh .dev
