#!/usr/bin/env bash
# Twelfth session: #5's benchmark after the launch-order change (commit in RESULTS.md), one
# process per shape with dense SDPA (cuDNN, FA2) and FlexAttention: Wan and CogVideoX random
# 10/30%, band, dense; HunyuanVideo random 10%.
set -uo pipefail
. benchmarks/device/common.sh
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 200 python3 -m tessera bench --shape $s --case random-10,random-30,band-16,dense \
    --reps 10 --json "$out/bench_$s.json" > "$out/bench_$s.txt" 2>"$out/bench_err_$s.txt"
  echo "bench $s rc=$?"; cat "$out/bench_$s.txt"
done
timeout 180 python3 -m tessera bench --shape hunyuan-720p --case random-10 --reps 3 \
  --json "$out/bench_hunyuan.json" > "$out/bench_hunyuan.txt" 2>"$out/bench_err_hunyuan.txt"
echo "bench hunyuan rc=$?"; cat "$out/bench_hunyuan.txt"
