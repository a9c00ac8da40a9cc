#!/usr/bin/env bash
# On the device: gpt-oss-20b's mixture of experts (issue #25), from the checkout after ~/dev is
# set up (`.pk/dev.tar.xz` unpacked, `.gl` in `.dev`). Output under $OUT.
#   moe.sh [BENCH_BINARY]
# 1. with BENCH_BINARY (the kernels' test binary built with `--features bench`): the one-token
#    feed-forward at gpt-oss-20b's and qwen3moe's shapes, fused against unfused, each kernel
#    against the time to read its weights (`moe_decode_timing`, benches/moe_bench.rs), with the
#    expert products on the f32 matvec and on 8-bit dot products (OCTOFLOW_MOE_DOT=0, 1); and
#    one token of gpt-oss's Q8_0 shapes on 8-bit dots against the f32 matvec (`dot_batch_layouts`)
# 2. the kernels' MoE and MXFP4 tests (the grouped products' cooperative-matrix variants and
#    `moe_dot.comp` run there whatever the switches say)
# 3. `octoflow bench` on the gpt-oss-20b shaped file (written once into ~/models, ~100 s): the
#    grouped products plain and on cooperative matrices, the few-token fusions off, decode with
#    the expert products and the large Q8_0 products on 8-bit dots, 8 and 32 streams with the
#    grouped products in tiles of 16 pairs and of 64 (OCTOFLOW_MOE_COOP_NARROW_MAX=64, 0), and
#    the decode profile
set -uo pipefail
repo=$PWD
cd ~/dev/.dev && source ./setup.sh >/dev/null 2>&1
m=~/models/gpt-oss-20b-shaped.gguf
[ -s $m ] || PYTHONPATH=${GGUF_PY:-~/py} python3 "$repo/scripts/models/shaped_gguf.py" gpt-oss-20b $m \
  > "$OUT/shape.log" 2>&1 &
if [ -n "${1:-}" ]; then
  for d in 0 1; do
    OCTOFLOW_MOE_DOT=$d timeout 240 "$1" moe_decode_timing --ignored --nocapture --test-threads 1
  done > "$OUT/moe_timing.log" 2>&1
  LINEAR_BENCH=q8_0 timeout 120 "$1" dot_batch_layouts --ignored --nocapture --test-threads 1 \
    > "$OUT/q8_0_dot.log" 2>&1
fi
timeout 120 ./octoflow_kernels moe mxfp4 moe_dot --test-threads 1 > "$OUT/kernels_moe.log" 2>&1
echo "rc=$?" >> "$OUT/kernels_moe.log"
wait
{
  for coop in 0 1; do
    echo "== OCTOFLOW_MOE_COOP=$coop"
    OCTOFLOW_MOE_COOP=$coop timeout 120 ./octoflow bench -m $m -p 512 -n 128 -r 2 2>&1 |
      grep -E "error|device memory|\| *(pp|tg)"
  done
  echo "== OCTOFLOW_UNFUSED_MOE=1"
  OCTOFLOW_UNFUSED_MOE=1 timeout 60 ./octoflow bench -m $m -p 0 -n 128 -r 2 2>&1 | grep -E "error|\| *tg"
  for v in "0 none" "1 none" "1 1000000"; do
    set -- $v
    echo "== OCTOFLOW_MOE_DOT=$1 OCTOFLOW_DOT_MIN_WEIGHTS=$2"
    OCTOFLOW_MOE_DOT=$1 OCTOFLOW_DOT_MIN_WEIGHTS=$2 timeout 60 ./octoflow bench -m $m -p 0 -n 128 -r 2 2>&1 |
      grep -E "error|\| *tg"
  done
  # several streams' decode steps: the grouped products in tiles of 16 pairs, then of 64
  for n in 64 0; do
    echo "== OCTOFLOW_MOE_COOP_NARROW_MAX=$n"
    OCTOFLOW_MOE_COOP_NARROW_MAX=$n timeout 120 ./octoflow bench -m $m --streams 8,32 2>&1 |
      grep -E "error|^\| *[0-9]"
  done
} > "$OUT/moe_bench.log" 2>&1
OCTOFLOW_MOE_DOT=1 OCTOFLOW_DOT_MIN_WEIGHTS=1000000 timeout 60 ./octoflow bench -m $m -p 0 -n 64 -r 1 --profile \
  > "$OUT/moe_profile.log" 2>&1
