#!/usr/bin/env bash
# Twelfth session, after the launch-order change: (1) #5's 64-token cubes (top-k pooled) next to
# random 10% of 128-token blocks, one process per shape; (2) #4's benchmark for the portable
# family (the regime a non-Hopper GPU plans by default, forced on the H200).
set -uo pipefail
. benchmarks/device/common.sh
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 150 python3 -m tessera bench --shape $s --case random-10 --family topk_pooled \
    --reps 10 --json "$out/cubes_$s.json" > "$out/cubes_$s.txt" 2>/dev/null
  echo "cubes $s rc=$?"; cat "$out/cubes_$s.txt"
done
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 150 python3 -m tessera bench --shape $s --case random-10,random-30,band-16,dense \
    --regime "sm80_128x64_w4_s2[combine_threshold=0.0]" --reps 10 --json "$out/sm80_$s.json" \
    > "$out/sm80_$s.txt" 2>/dev/null
  echo "sm80 $s rc=$?"; cat "$out/sm80_$s.txt"
done
