#!/usr/bin/env bash
# Eleventh session, last call: the portable family's GPU tests, now including the regime a
# non-Hopper GPU plans by default (128-row tiles at every head dim) in the dtype x head dim x
# layout test; memcheck and racecheck on it.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_sm80 150 tests/test_attention_gpu.py -k "sm80"
sanitize memcheck 90 "test_dtype_headdim_layout and bhld and sm80-"
sanitize racecheck 90 "test_dtype_headdim_layout and bfloat16 and bhld and sm80-"
