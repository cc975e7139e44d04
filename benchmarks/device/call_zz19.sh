#!/usr/bin/env bash
# Eleventh session: where a request's host time goes (#4's request target, 1.5x Flex at 10%:
# the portable family's request was 1.16x / 1.46x with ~0.5 ms above its kernel,
# call_zz17.sh): benchmarks/request_hotspots.py (cProfile of 200 requests) for the portable
# regime and the default, Wan and CogVideoX at 10%.
set -uo pipefail
. benchmarks/device/common.sh
for s in wan-1.3b-480p cogvideox-5b; do
  for r in "sm80_128x64_w4_s2[combine_threshold=0.0]" ""; do
    f="$out/hotspots_${s}_${r:0:4}.txt"
    timeout 120 python3 benchmarks/request_hotspots.py --shape $s --density 0.1 --n 200 --top 30 \
      ${r:+--regime "$r"} > "$f" 2>&1
    echo "rc=$?"; tail -1 "$f"
  done
done
