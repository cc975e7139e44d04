#!/usr/bin/env bash
# Fourteenth session: 64x64 producer tiles at head dim 128 with two CTAs an SM (one Q buffer,
# no alignment slack: SMEM_ALIGNED), uncommitted when run -- for the 64-token top-k cubes.
# The GPU tests that run 64-row producer variants, memcheck/racecheck of the new test, then
# kernel A/B on Wan's top-k cubes against HEAD (435d362 in .ab/old, where the same regimes run
# one CTA an SM with two Q buffers), the order alternating by round.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests/test_attention_gpu.py \
  -k "two_64_row or tma_copies_equal or packed_keys or persistent or gqa"
sanitize memcheck 90 "two_64_row"
sanitize racecheck 120 "two_64_row and False"
one() {  # tree label regime
  PYTHONPATH=$1 timeout 60 python3 $1/benchmarks/sweep.py --shape wan-1.3b-480p \
    --family topk_pooled --regime "$3" 2>&1 | tail -1 | sed "s|^|$2 |" | tee -a "$out/ab_cubes.txt"
}
for round in 1 2; do
  for reg in "sm90_64x64_w8_s3[combine_threshold=0.0]" \
             "sm90_64x64_w8_s3[combine_threshold=0.0,pack_keys=True]" \
             "sm90_64x64_w4_s3[combine_threshold=0.0,pack_keys=True]"; do
    if [ $round = 1 ]; then one "$PWD" new "$reg"; one "$PWD/.ab/old" old "$reg"
    else one "$PWD/.ab/old" old "$reg"; one "$PWD" new "$reg"; fi
  done
done
