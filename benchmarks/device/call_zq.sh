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
