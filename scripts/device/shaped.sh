#!/usr/bin/env bash
# On the device: full-scale shapes against llama.cpp CUDA (issue #25's H100 table).
#   shaped.sh prepare   builds llama-bench and llama-batched-bench from the pruned llama.cpp
#                       sources (~/lc, the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp) and
#                       writes the shaped GGUFs (scripts/models/shaped_gguf.py) into ~/models
#   shaped.sh bench     load time, device memory, pp512, tg128 and 1/8/32 streams for both
#                       engines on each file, one after the other (nothing else running)
# Output under $OUT. Run from the checkout (the call's working directory).
set -uo pipefail
repo=$PWD
models=(gpt-oss-20b llama-8b)
case "${1:-}" in
prepare)
  (cd ~/lc && cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build build -j16 --target llama-bench llama-batched-bench) > "$OUT/llama-build.log" 2>&1 &
  build=$!
  mkdir -p ~/models
  for s in "${models[@]}"; do
    [ -s ~/models/$s-shaped.gguf ] ||
      PYTHONPATH=~/lc/gguf-py python3 "$repo/scripts/models/shaped_gguf.py" $s ~/models/$s-shaped.gguf
  done
  ls -la ~/models | tee "$OUT/models.txt"
  wait $build
  echo "llama.cpp build rc=$?" | tee -a "$OUT/llama-build.log"
  ls ~/lc/build/bin
  ;;
bench)
  cd ~/dev/.dev && cp -r ~/dev/.gl . 2>/dev/null; source ./setup.sh >/dev/null 2>&1
  for s in "${models[@]}"; do
    m=~/models/$s-shaped.gguf
    {
      echo "== $s: octoflow"
      t0=$(date +%s.%N)
      timeout 300 ./octoflow run -m $m -p "Hello" -n 1 --temp 0 >/dev/null 2>"$OUT/$s-run.err"
      echo "load+1 token wall s: $(awk "BEGIN{print $(date +%s.%N) - $t0}")"
      timeout 300 ./octoflow bench -m $m -p 512 -n 128 -r 3 2>&1 | grep -E "device memory|pp512|tg128|error"
      timeout 300 ./octoflow bench -m $m --streams 1,8,32 2>&1 | tail -6
      echo "== $s: llama.cpp"
      t0=$(date +%s.%N)
      timeout 300 ~/lc/build/bin/llama-bench -m $m -ngl 99 -fa 1 -p 0 -n 1 -r 1 >/dev/null 2>&1
      echo "load+1 token wall s: $(awk "BEGIN{print $(date +%s.%N) - $t0}")"
      timeout 300 ~/lc/build/bin/llama-bench -m $m -ngl 99 -fa 1 -p 512 -n 128 -r 3 2>&1 | grep -E "pp512|tg128|error"
      timeout 300 ~/lc/build/bin/llama-batched-bench -m $m -ngl 99 -fa on -c 8448 -npp 128 -ntg 128 \
        -npl 1,8,32 2>&1 | grep -E "^\|| buffer size|error"
    } 2>&1 | tee -a "$OUT/shaped.log"
  done
  ;;
*)
  echo "usage: shaped.sh prepare|bench" >&2
  exit 2
  ;;
esac
