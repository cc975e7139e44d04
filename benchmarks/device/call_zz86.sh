#!/usr/bin/env bash
# Nineteenth session: requests never split (plan(split_tasks=False)) and a captured request's
# regime taken from its warm-up's selection. (1) the whole GPU suite; (2) memcheck on the
# capture tests; (3) pytest-benchmark's rows again (call_zz85 ran them before the change, same
# command); (4) #4's portable family forced never-split (sync-free, kept plans) at 10%.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 330 tests --maxfail=20
sanitize memcheck 120 "captured_in_a_cuda_graph"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu benchmarks/test_bench_gpu.py \
  --benchmark-enable --benchmark-min-rounds=5 --benchmark-max-time=0.5 \
  --benchmark-json="$out/bench_gpu.json" --benchmark-columns=median,rounds \
  --benchmark-sort=name > "$out/bench_gpu.txt" 2>&1
echo "bench_gpu rc=$?: $(tail -1 "$out/bench_gpu.txt")"
grep -E "^test_(request|captured_request|kernel)\[" "$out/bench_gpu.txt" | head -60
request_bench 170 --shape wan-1.3b-480p,cogvideox-5b --case random-10 --reps 10 \
  --regime "sm80_128x64_w4_s2[combine_threshold=0.0,split_ratio=1000000000.0]"
