#!/usr/bin/env bash
# Fourteenth session: the small-block default at head dim 128 is now the 64x64 producer variant
# with two CTAs an SM (sm90_64x64_w8_s3, uncommitted when run), and so are the 64-row sm90
# candidates at head dim 128: the GPU tests over those regimes and the device planner, then
# #4/#5's bench on Wan's random 10% and top-k cubes (the 64-token blocks' rate against the
# 128-block one).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 150 tests/test_attention_gpu.py \
  -k "(every_candidate and 128) or 64_token or two_64_row or device_planner_equals"
request_bench 150 --shape wan-1.3b-480p --case random-10 --family topk_pooled --reps 10
