#!/usr/bin/env bash
# Prepared at the end of the ninth session, NOT yet run (first call of the next session, main):
# 1. the GPU test written after the last device call (the tilings' pair estimate of a device
#    mask) and the whole suite (bsa_sm90.cu changed only by a preprocessor guard since
#    call_zz2.sh's 242 passed);
# 2. memcheck and racecheck on default-regime tests, which now copy by TMA at 128-row tiles;
# 3. the bench on HunyuanVideo's other families (D=128) against the baselines.
set -uo pipefail
. benchmarks/device/common.sh
timeout 60 python3 benchmarks/device/probe_bisect.py $PWD 2>&1 | tail -3
gpu_tests new 60 tests/test_attention_gpu.py -k "tiling_pairs"
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize memcheck 120 "test_dtype_headdim_layout or test_variable_blocks_and_empty_rows or test_heavy_rows"
sanitize racecheck 90 "test_heavy_rows_split_and_combined"
timeout 240 python3 -m tessera bench --shape hunyuan-720p --family spatial_temporal,radial,random_blocks \
  --reps 3 --json "$out/bench_hunyuan.json" > "$out/bench_hunyuan.txt" 2>/dev/null
echo "hunyuan bench rc=$?"; cat "$out/bench_hunyuan.txt"
