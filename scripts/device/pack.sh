#!/usr/bin/env bash
# Here: collects the binaries and scripts the device needs into .dev/ (run from the repo root;
# builds the workspace's test executables and `octoflow` first if they are stale). The test
# executables are the ones cargo names for this checkout (other worktrees sharing the target
# folder build executables of the same names).
set -euo pipefail
mkdir -p .dev
grep -qxF "/.dev/" .git/info/exclude || echo "/.dev/" >> .git/info/exclude
cargo build --quiet -p octoflow
exes=$(cargo test --workspace --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
for t in octoflow_vk octoflow_kernels octoflow_model gpu_chain gpu_batch gpu_agreement gradients shared_model gpu_run gpu_phases; do
  bin=$(echo "$exes" | grep "/$t-" | head -1)
  strip -o ".dev/$t" "$bin"
done
strip -o .dev/octoflow target/debug/octoflow
pwd > .dev/build_root
cp scripts/bench/warm_start.py scripts/bench/agents_http.py scripts/device/run.sh scripts/device/agents.sh scripts/device/train.sh scripts/device/lora.sh scripts/device/setup.sh .dev/
du -sh .dev
