#!/usr/bin/env bash
# On the device: issue #28's measurement. A sustained serving load (scripts/bench/serve_load.py,
# --concurrency streams for $DUR seconds) against `octoflow serve`, once per pacing setting given
# ("none" or a power target in W), each with its own server and --sensor-log; then
# scripts/bench/power_trace.py (here) plots the traces and judges how well each target is held.
#   homeo.sh model MODEL.gguf            writes llama-8b's shapes (scripts/models/shaped_gguf.py)
#   homeo.sh bench MODEL.gguf            octoflow bench's J/token columns on MODEL
#   homeo.sh serve MODEL.gguf none 250 150
# Output under $OUT. Run from the checkout (the call's working directory), after ~/dev is set up.
set -uo pipefail
repo=$PWD
cmd=$1 m=$2; shift 2
DUR=${DUR:-120} CONC=${CONC:-128} N=${N:-128}
case "$cmd" in
model)
  [ -s "$m" ] || PYTHONPATH=${GGUF_PY:-~/dev/.dev} python3 "$repo/scripts/models/shaped_gguf.py" llama-8b "$m"
  ls -la "$m"
  ;;
bench)
  cd ~/dev/.dev && source ./setup.sh >/dev/null 2>&1
  timeout 300 ./octoflow bench -m "$m" -p 512 -n 128 -r 3 2>&1 | tee -a "$OUT/bench.log"
  ;;
serve)
  cd ~/dev/.dev && source ./setup.sh >/dev/null 2>&1
  for target in "$@"; do
    flags=() name=unpaced
    if [ "$target" != none ]; then flags=(--power-target "$target"); name=${target}w; fi
    ./octoflow serve -m "$m" --instances "$CONC" -c 512 --port 8199 --queue 4096 \
      --sensor-log "$OUT/$name.csv" "${flags[@]}" > "$OUT/serve-$name.log" 2>&1 &
    pid=$!
    for _ in $(seq 240); do curl -sf http://127.0.0.1:8199/health >/dev/null && break; sleep 0.5; done
    echo "== $name" | tee -a "$OUT/load.log"
    python3 "$repo/scripts/bench/serve_load.py" --url http://127.0.0.1:8199 --concurrency "$CONC" \
      --duration "$DUR" -n "$N" 2>&1 | tee -a "$OUT/load.log"
    curl -s http://127.0.0.1:8199/metrics | grep -E "^octoflow_(gpu|pacing)" >> "$OUT/load.log"
    kill $pid; wait $pid 2>/dev/null
  done
  ;;
esac
