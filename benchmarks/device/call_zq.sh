#!/usr/bin/env bash
# Seventh session, last call: the GPU suite at HEAD, then the request bench (WORKLOADS cases and
# mask families, same run as FlexAttention and dense SDPA).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests --maxfail=20
s=$(date +%s)
timeout 300 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense \
  --family all --reps 10 --json "$out/bench.json" --png "$out/bench.png" > "$out/bench.txt" 2>"$out/bench_err.txt"
echo "bench rc=$? $(( $(date +%s)-s ))s"; cat "$out/bench.txt"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "planner or sync or persistent" > "$out/sanitizer.txt" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' $out/sanitizer.txt | tail -2 | tr '\n' ' ')"
