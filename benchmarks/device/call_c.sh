#!/usr/bin/env bash
# Device call: GPU suite with the committed H200 table in force (incl. every candidate regime),
# held-out evaluation of the table, and bench over the mask families.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu tests > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"
grep -E "^FAILED" "$out/gpu_tests.txt" | head -10
s=$(date +%s)
timeout 270 python3 -m tessera profile --evaluate tables/nvidia-h200.json --out "$out/eval.json" \
  --budget-minutes ${BUDGET:-3.3} > "$out/eval.txt" 2> "$out/eval_log.txt"
echo "evaluate rc=$? $(( $(date +%s)-s ))s"; cat "$out/eval.txt"
s=$(date +%s)
timeout 170 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --family all --reps 10 \
  --json "$out/bench_families.json" --png "$out/bench_families.png" > "$out/bench_families.txt" 2> "$out/bench_err.txt"
echo "bench rc=$? $(( $(date +%s)-s ))s"; cat "$out/bench_families.txt"; tail -3 "$out/bench_err.txt" | tr '\r' '\n' | tail -3
