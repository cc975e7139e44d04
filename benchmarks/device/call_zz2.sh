#!/usr/bin/env bash
# Ninth session, branch tma, after call_zz.sh: the 64x128 D=128 TMA variant no longer spills and
# the fallback test uses a stride TMA cannot describe. 1. the tests that failed, the TMA tests,
# the whole suite, racecheck and memcheck; 2. the bench against the baselines in one run (dense
# SDPA cuDNN/flash, FlexAttention), TMA on by default.
set -uo pipefail
. benchmarks/device/common.sh
timeout 60 python3 benchmarks/device/probe_bisect.py $PWD 2>&1 | tail -3
gpu_tests tma_tests 120 tests/test_attention_gpu.py tests/test_tma.py \
  -k "tma or test_variable_blocks_and_empty_rows or aligned_tiles"
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize racecheck 60 "tma_copies and (128-128-64 or 128-128-128)"
sanitize memcheck 60 "tma_copies and (128-128-128 or 64-64-64 or 64-128-128)"
request_bench 250 --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense \
  --family all --reps 10
