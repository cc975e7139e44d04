#!/usr/bin/env bash
# Seventh session (after two Q buffers and the first host trims): the GPU suite at HEAD, then
# the request bench (alone and back to back, same run as FlexAttention and dense SDPA) on the
# WORKLOADS cases and mask families, and the host time of each request phase.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests --maxfail=20
request_bench 300 --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense \
  --family all --reps 10
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 40 python3 benchmarks/request_phases.py --shape $s --n 100 > "$out/phases_$s.txt" 2>&1
  echo "== $s rc=$?"; cat "$out/phases_$s.txt"
done
