#!/usr/bin/env bash
# Prepared at the end of the sixteenth session, NOT yet run. (1) Head dim 64's new default
# (64x128 producer tiles, two CTAs an SM) in its cp.async form -- what operands TMA cannot
# describe get -- against the 128x128 cp.async form it replaced there, CogVideoX random 10% and
# dense (correct on the GPU, call_zz61, never timed). (2) The 64-row regimes on the top-k
# cubes after the sixteenth session's packed-walk changes: whether the producer form now beats
# the plain one at head dim 64 (default_regime keeps it plain on fifteenth-session figures).
set -uo pipefail
. benchmarks/device/common.sh
d64="sm90_64x128_w8_s3[combine_threshold=0.0]"
d128="sm90_128x128_w12_s3[combine_threshold=0.0]"
for round in 1 2; do
  for what in "--density 0.1" "--density 1.0"; do
    timeout 90 python3 benchmarks/sweep.py --shape cogvideox-5b $what --no-tma --regime "$d64" \
      --regime "$d128" 2>&1 | tail -2 | tee -a "$out/cpasync_d64.txt"
    timeout 90 python3 benchmarks/sweep.py --shape cogvideox-5b $what --regime "$d64" \
      --regime "$d128" 2>&1 | tail -2 | tee -a "$out/tma_d64.txt"
  done
done
p="combine_threshold=0.0,pack_keys=True"
for shape in cogvideox-5b wan-1.3b-480p; do
  timeout 120 python3 benchmarks/sweep.py --shape $shape --family topk_pooled \
    --regime "sm90_64x64_w4_s3[$p]" --regime "sm90_64x64_w8_s3[$p]" \
    --regime "sm90_64x128_w4_s3[$p]" --regime "sm90_64x128_w8_s3[$p]" 2>&1 | tail -4 \
    | tee -a "$out/cubes_64row.txt"
done
