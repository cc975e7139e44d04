#!/usr/bin/env bash
# Sixth session, second call: sync-free device planning. The new GPU tests first (fail fast),
# the whole GPU suite, memcheck on the planner tests (bounded buffers, the kernels' device task
# count), then the request bench with back-to-back timings, same run as FlexAttention.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests smoke 100 tests/test_attention_gpu.py -x -k "device_planner_equals or never_waits or graph"
gpu_tests gpu_tests 150 tests --maxfail=20
s=$(date +%s)
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_attention_gpu.py -k "device_planner_equals_host_planner and (many or random)" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$? $(( $(date +%s)-s ))s: $(grep -E 'ERROR SUMMARY|passed|failed' $out/memcheck.txt | tail -2 | tr '\n' ' ')"
s=$(date +%s)
timeout 190 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,dense \
  --reps 10 --json "$out/bench.json" > "$out/bench.txt" 2>"$out/bench_err.txt"
echo "bench rc=$? $(( $(date +%s)-s ))s"; cat "$out/bench.txt"
