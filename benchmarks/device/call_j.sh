#!/usr/bin/env bash
# Device call: the one-sync device planner and the sm90 family — GPU tests, memcheck on the
# planner + sm90 tests, planning cost, bench (cases and families) and demo.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TESSERA_CACHE_DIR=/tmp/tc
s=$(date +%s)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests --maxfail=20 > "$out/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(( $(date +%s)-s ))s: $(tail -1 $out/gpu_tests.txt)"; grep -E "^FAILED" "$out/gpu_tests.txt" | head -20
s=$(date +%s)
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "device_planner_equals or (variable_blocks and sm90) or (heavy_rows and sm90)" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$? $(( $(date +%s)-s ))s: $(grep -E 'ERROR SUMMARY|passed|failed' $out/memcheck.txt | tail -2 | tr '\n' ' ')"
timeout 60 python3 benchmarks/plan_speed.py 2>&1 | tee "$out/plan_speed.txt"
timeout 150 python3 benchmarks/plan_families.py 2>&1 | tee "$out/plan_families.txt"
timeout 60 python3 -m tessera demo > "$out/demo.txt" 2>&1; echo "demo rc=$?"; cat "$out/demo.txt"
timeout 200 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense --family all \
  --reps 10 --json "$out/bench.json" --png "$out/bench.png" > "$out/bench.txt" 2> "$out/bench_err.txt"; echo "bench rc=$?"; cat "$out/bench.txt"; tail -2 "$out/bench_err.txt"
