#!/usr/bin/env bash
# Ninth session, main after the TMA merge, the 128-row heuristic no longer packing: 1. the bench
# against the baselines with the new defaults (Wan, CogVideoX; HunyuanVideo's D=128 cases);
# 2. D=64 regimes with TMA (192-row vs 128-row tiles) on CogVideoX; 3. 64-row regimes on the
# top-k cubes now that the unpacked producer variant copies by TMA.
set -uo pipefail
. benchmarks/device/common.sh
timeout 40 python3 benchmarks/device/probe_bisect.py $PWD 2>&1 | tail -2
request_bench 150 --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense \
  --family all --reps 10
timeout 150 python3 -m tessera bench --shape hunyuan-720p --case random-10,dense \
  --family sliding_tile,topk_pooled --reps 3 --json "$out/bench_hunyuan.json" \
  > "$out/bench_hunyuan.txt" 2>/dev/null; echo "hunyuan bench rc=$?"; cat "$out/bench_hunyuan.txt"
for d in 0.1 1.0; do
  for only in sm90_192 sm90_128x128_w12; do
    timeout 40 python3 benchmarks/sweep.py --shape cogvideox-5b --density $d --only $only 2>&1 | tail -6
  done
done | tee "$out/sweep_d64.txt"
timeout 60 python3 benchmarks/sweep.py --shape cogvideox-5b --family topk_pooled --only sm90_64 \
  > "$out/sweep_topk.txt" 2>&1; head -8 "$out/sweep_topk.txt"
