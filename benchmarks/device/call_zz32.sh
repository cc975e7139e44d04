#!/usr/bin/env bash
# Thirteenth session, ran once on an uncommitted tree whose Regime accepted block_n 192 for
# 128-row producer tiles (that regime was not kept: the name no longer parses; RESULTS.md,
# thirteenth session). 192-key steps at head dim 64 (128x192 tiles, TMA producer, no P V overlap:
# FlashAttention-3's key step there) -- correctness, then kernel A/B against the default
# 128x128 on CogVideoX's masks, two rounds; then the memcheck of the planner cases that
# call_zz31.sh cut off at 160 s.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_192 150 tests/test_attention_gpu.py -k "192_key_steps or three_consumer"
base="sm90_128x128_w12_s3[combine_threshold=0.0]"; wide="sm90_128x192_w12_s3[combine_threshold=0.0]"
for round in 1 2; do
  for c in "--density 1.0" "--density 0.3" "--density 0.1" "--family sliding_tile" \
           "--family spatial_temporal" "--family radial"; do
    timeout 60 python3 benchmarks/sweep.py --shape cogvideox-5b $c --regime "$base" \
      --regime "$wide" 2>&1 | tail -2 | tee -a "$out/sweep_192.txt"
  done
done
sanitize memcheck 300 "device_planner_equals_host"
