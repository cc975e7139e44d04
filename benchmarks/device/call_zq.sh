#!/usr/bin/env bash
# Seventh session, last call: the GPU suite at HEAD, the request bench (WORKLOADS cases and
# mask families, same run as FlexAttention and dense SDPA), memcheck of the planner tests.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests --maxfail=20
request_bench 300 --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense \
  --family all --reps 10
sanitize memcheck 120 "planner or sync or persistent"
