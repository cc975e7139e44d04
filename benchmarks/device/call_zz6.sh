#!/usr/bin/env bash
# Prepared at the end of the ninth session, NOT yet run (first call of the next session, main):
# 1. the GPU tests written after the last device call: the tilings' pair estimate of a device
#    mask, and the device planner's aligned tiles (plan_aligned_spans) array for array against
#    the host planner, sync-free and one-sync, then run; then the whole suite (bsa_sm90.cu
#    changed only by a preprocessor guard since call_zz2.sh's 242 passed);
# 2. memcheck on the planner test (the new kernel) and on default-regime tests (TMA copies at
#    128-row tiles); racecheck on a split case;
# 3. (moved to call_zz6b.sh: one call is limited to 600 s) the semantic clusters (and random blocks) with the plain default and with aligned tiles
#    forced, in one process each, against the baselines: the request with aligned tiles now
#    planned by the kernels (was 14-15 ms by the general path, call_zz5.sh). If aligned wins
#    the request, make align_pays part of select_regime (see RESULTS, ninth session).
set -uo pipefail
. benchmarks/device/common.sh
timeout 60 python3 benchmarks/device/probe_bisect.py $PWD 2>&1 | tail -3
gpu_tests new 150 tests/test_attention_gpu.py -k "tiling_pairs or device_planner_equals or aligned"
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize memcheck 150 "device_planner_equals or test_dtype_headdim_layout or test_variable_blocks_and_empty_rows"
sanitize racecheck 90 "test_heavy_rows_split_and_combined"
