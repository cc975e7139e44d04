#!/usr/bin/env bash
# Thirteenth session, last call: the wide step made opt-in (Regime.wide_steps) after call_zz33.sh
# measured it +6.5% on dense CogVideoX but -3-5% on random 10% and spatial-temporal masks.
# 1. correctness of the default D=64 kernel (refactored loop, no wide step) and of the opt-in;
# 2. kernel A/B, alternating, two rounds: the tree before the change (.ab/old, a7da019; delete
#    after), this tree's default, this tree with wide_steps -- is the default back to the old
#    rate (the slowdown the wide variant's, not the refactor's)?
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_d64 150 tests/test_attention_gpu.py -k \
  "wide_key_steps or tma_copies_equal or (dtype_headdim_layout and 64) or persistent"
base="sm90_128x128_w12_s3[combine_threshold=0.0]"
wide="sm90_128x128_w12_s3[combine_threshold=0.0,wide_steps=True]"
for round in 1 2; do
  for c in "--density 1.0" "--density 0.1" "--family spatial_temporal" "--family sliding_tile"; do
    PYTHONPATH=$PWD/.ab/old timeout 40 python3 .ab/old/benchmarks/sweep.py --shape cogvideox-5b \
      $c --regime "$base" 2>&1 | tail -1 | sed "s|^|old |" | tee -a "$out/ab_wide2.txt"
    timeout 60 python3 benchmarks/sweep.py --shape cogvideox-5b $c --regime "$base" \
      --regime "$wide" 2>&1 | tail -2 | sed "s|^|new |" | tee -a "$out/ab_wide2.txt"
  done
done
