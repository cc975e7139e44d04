#!/usr/bin/env bash
# Fifteenth session, at 043cfe1 (the unbranched softmax): memcheck and racecheck on the sm90
# tests whose warps sit outside spans (restricted merges, aligned tiles), then #5's bench on
# every family (Wan, CogVideoX) and on HunyuanVideo's random and dense cases, kernel-only.
set -uo pipefail
. benchmarks/device/common.sh
sanitize memcheck 150 "(restricted_merge_rows or aligned_tiles) and sm90"
sanitize racecheck 120 "restricted_merge_rows and sm90ws"
request_bench 200 --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense \
  --family sliding_tile,spatial_temporal,topk_pooled --reps 10
start=$(date +%s)
timeout 200 python3 -m tessera bench --shape hunyuan-720p --case random-10,random-30,band-16,dense \
  --reps 5 --json "$out/bench_hy.json" > "$out/bench_hy.txt" 2> "$out/bench_hy_err.txt"
echo "bench hunyuan rc=$? $(( $(date +%s) - start ))s"; cat "$out/bench_hy.txt"
