#!/usr/bin/env bash
# Seventh session: deeper K/V rings for the warp-specialized 128x128 variant at head dim 64
# (CogVideoX), where one chunk of compute is too short to hide a K/V load from DRAM.
set -uo pipefail
. benchmarks/device/common.sh
for dens in 0.1 0.3 1.0; do
  timeout 100 python3 benchmarks/sweep.py --shape cogvideox-5b --density $dens --only sm90_128x128_w12 2>&1 | tee "$out/sweep_cogvideox_$dens.txt"
done
timeout 60 python3 benchmarks/sweep.py --shape cogvideox-5b --density 0.1 --only sm90_64x64_w4_s3 2>&1 | tee -a "$out/sweep_cogvideox_0.1.txt"
