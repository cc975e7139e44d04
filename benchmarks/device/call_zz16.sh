#!/usr/bin/env bash
# Eleventh session: the portable family after c3418c5 (no WARPSYNC per row tile, whole-chunk
# copies by pointer steps). The regime table and default_regime's D=64 choice (64-row tiles)
# were measured before either change, when two row tiles a warp paid a WARPSYNC per mma pair.
# 1. every sm80 regime of benchmarks/sweep.py on Wan and CogVideoX at 10% and 30% and dense;
# 2. #4's benchmark for the portable family: the bench with the regime forced, in one process
#    with dense SDPA (cuDNN, FA2) and FlexAttention.
set -uo pipefail
. benchmarks/device/common.sh
for c in "wan-1.3b-480p 1.0" "wan-1.3b-480p 0.1" "cogvideox-5b 1.0" "cogvideox-5b 0.1" "cogvideox-5b 0.3"; do
  set -- $c
  timeout 80 python3 benchmarks/sweep.py --shape $1 --density $2 --only sm80 2>&1 | tee -a "$out/sweep_sm80.txt"
done
for c in "wan-1.3b-480p sm80_128x64_w4_s2" "cogvideox-5b sm80_64x64_w4_s2" "cogvideox-5b sm80_128x64_w4_s2"; do
  set -- $c
  timeout 150 python3 -m tessera bench --shape $1 --case random-10,random-30,band-16,dense \
    --regime $2 --reps 10 --json "$out/bench_$1_$2.json" > "$out/bench_$1_$2.txt" 2>/dev/null
  echo "bench $1 $2 rc=$?"; cat "$out/bench_$1_$2.txt"
done
