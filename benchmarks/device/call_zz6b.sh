#!/usr/bin/env bash
# Tenth session, after call_zz6.sh (split from it: one device call is limited to 600 s):
# 1. call_zz6.sh's failures (test_aligned_tiles: the device planner reported no straddling
#    tiles, num_merged 0; now both planners count them from the geometry) and memcheck on the
#    new planner kernel's tests (call_zz6.sh's memcheck selection ran past its 150 s);
# 2. the semantic clusters (and random blocks) with the plain default and with aligned tiles forced, one
# process each, against the baselines. The request with aligned tiles is now planned by the
# device kernels (was 14-15 ms by the general path, call_zz5.sh).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests aligned 120 tests/test_attention_gpu.py -k "test_aligned_tiles or device_planner_equals"
sanitize memcheck 150 "test_aligned_tiles and sm90-128"
aligned="sm90_128x128_w12_s3[combine_threshold=0.0,align_tiles=True]"
for regime in "" "$aligned"; do
  timeout 100 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b \
    --family semantic_clusters,random_blocks --reps 10 ${regime:+--regime "$regime"} \
    > "$out/bench_semantic_${regime:+aligned}.txt" 2>/dev/null
  echo "bench ${regime:-default} rc=$?"; cat "$out/bench_semantic_${regime:+aligned}.txt"
done
