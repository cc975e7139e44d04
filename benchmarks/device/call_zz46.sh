#!/usr/bin/env bash
# Prepared at the end of the fourteenth session, NOT yet run. (1) The whole GPU suite on main
# at 986611f+ (the two-CTA 64-row producer default at head dim 128 ran only its own tests and
# the candidate / 64-token / planner tests, call_zz45). (2) Whether head dims 64 and 96 should
# take the 64x64 producer variant for small blocks too (two CTAs an SM with two Q buffers
# there, unchanged; never measured against the plain default): CogVideoX's top-k cubes (D=64).
# (3) #5's bench on every family, kernel-only timing, three model shapes.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
for round in 1 2; do
  for reg in "sm90_64x64_w4_s3[combine_threshold=0.0,pack_keys=True]" \
             "sm90_64x64_w8_s3[combine_threshold=0.0,pack_keys=True]" \
             "sm90_64x64_w8_s3[combine_threshold=0.0]"; do
    timeout 60 python3 benchmarks/sweep.py --shape cogvideox-5b --family topk_pooled \
      --regime "$reg" 2>&1 | tail -1 | tee -a "$out/cubes_d64.txt"
  done
done
request_bench 300 --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,dense \
  --family sliding_tile,spatial_temporal,topk_pooled --reps 10
