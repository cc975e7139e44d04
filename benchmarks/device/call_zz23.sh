#!/usr/bin/env bash
# Twelfth session: (1) the launch order of one plan's tasks with the TMA kernel (K/V reuse in
# L2; benchmarks/task_order.py, now with "heavy first, then per head"); (2) kernel A/B of the
# TMA producer's L2 prefetch distance (TESSERA_L2_AHEAD 0 = main, 2, 5) on the default regime.
set -uo pipefail
. benchmarks/device/common.sh
for s in wan-1.3b-480p hunyuan-720p cogvideox-5b; do
  timeout 100 python3 benchmarks/task_order.py --shape $s --density 0.1 2>&1 | tee -a "$out/task_order.txt"
done
for a in 2 5; do
  mkdir -p /tmp/l2_$a && cp -r tessera benchmarks /tmp/l2_$a/
  sed -i "s/^#define TESSERA_L2_AHEAD 0$/#define TESSERA_L2_AHEAD $a/" /tmp/l2_$a/tessera/cuda/bsa_sm90.cu
  grep -c "define TESSERA_L2_AHEAD $a" /tmp/l2_$a/tessera/cuda/bsa_sm90.cu
done
ab_sweep 2 "pack_keys|align" "$PWD" /tmp/l2_2 /tmp/l2_5 -- "wan-1.3b-480p 0.1 sm90_128x128_w12_s3" \
  "hunyuan-720p 0.1 sm90_128x128_w12_s3" "cogvideox-5b 0.1 sm90_128x128_w12_s3" \
  "wan-1.3b-480p 1.0 sm90_128x128_w12_s3" | tee "$out/ab_l2.txt"
