#!/usr/bin/env bash
# Prepared at the end of the fifteenth session, NOT yet run. (1) The whole GPU suite at the final
# state (the wide step's rule now comes from the loader's macros -- SASS unchanged, but its
# variant's label is new; the scale check ran only with a subset, call_zz53). (2) The README's
# main job, `python3 -m tessera demo`, whose quoted output dates from 2026-11-29 (3ba5e27). (3)
# Whether the 64x128 two-CTA variant still helps CogVideoX's families after the unbranched
# softmax (call_zz47 measured it before), kernel-only.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
timeout 150 python3 -m tessera demo > "$out/demo.txt" 2>&1; echo "demo rc=$?"; cat "$out/demo.txt"
def="sm90_128x128_w12_s3[combine_threshold=0.0]"
new="sm90_64x128_w8_s3[combine_threshold=0.0]"
for round in 1 2; do
  if [ $round = 1 ]; then a=$def; b=$new; else a=$new; b=$def; fi
  for what in "--density 0.1" "--family spatial_temporal" "--family sliding_tile"; do
    timeout 90 python3 benchmarks/sweep.py --shape cogvideox-5b $what --regime "$a" \
      --regime "$b" 2>&1 | tail -2 | tee -a "$out/ab_64x128.txt"
  done
done
