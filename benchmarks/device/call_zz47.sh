#!/usr/bin/env bash
# Fifteenth session: 64x128 TMA producer tiles at head dim 64 now split the registers for two
# CTAs an SM (two Q buffers, no alignment slack), like the 64x64 ones. Their GPU test and
# memcheck, then whether two independent 64-row CTAs an SM (task boundaries no longer shared by
# the two consumer warpgroups) beat CogVideoX's 128x128 default: both regimes in one process
# per case, two rounds with the order swapped.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests/test_attention_gpu.py \
  -k "two_64_row or tma_copies_equal or persistent or (every_candidate and 64)"
sanitize memcheck 120 "two_64_row and 64-128"
def="sm90_128x128_w12_s3[combine_threshold=0.0]"
new="sm90_64x128_w8_s3[combine_threshold=0.0]"
for round in 1 2; do
  if [ $round = 1 ]; then a=$def; b=$new; else a=$new; b=$def; fi
  for what in "--density 0.1" "--density 0.3" "--density 1.0" "--family spatial_temporal" \
              "--family sliding_tile"; do
    timeout 90 python3 benchmarks/sweep.py --shape cogvideox-5b $what --regime "$a" \
      --regime "$b" 2>&1 | tail -2 | tee -a "$out/ab_64x128.txt"
  done
done
