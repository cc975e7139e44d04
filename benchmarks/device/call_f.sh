#!/usr/bin/env bash
# Device call: the new heuristic default (no restricted merges) — GPU tests, demo, bench.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests -k "not every_candidate" > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head
timeout 60 python3 -m tessera demo > "$out/demo.txt" 2>&1; echo "demo rc=$?"; cat "$out/demo.txt"
timeout 120 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10 --family sliding_tile,topk_pooled \
  --reps 10 --json "$out/bench.json" > "$out/bench.txt" 2> "$out/bench_err.txt"; echo "bench rc=$?"; cat "$out/bench.txt"
