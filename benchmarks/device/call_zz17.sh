#!/usr/bin/env bash
# Eleventh session: (1) the TMA producer's consumers without the per-chunk proxy fence (TMA
# writes through the async proxy the wgmma read from; the fence is for cp.async's generic
# writes): the GPU suite, then a kernel A/B against the file at c3418c5 (.ab/bsa_sm90_base.cu)
# on the default regime; (2) #4's benchmark for the portable family with the regime a non-Hopper
# GPU plans by default (128-row tiles, combine_threshold 0: the device planner), in one process
# with dense SDPA (cuDNN, FA2) and FlexAttention.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 230 tests --maxfail=20
mkdir -p /tmp/ab_base && cp -r tessera benchmarks /tmp/ab_base/ && cp .ab/bsa_sm90_base.cu /tmp/ab_base/tessera/cuda/bsa_sm90.cu
ab_sweep 2 "pack_keys|align" /tmp/ab_base "$PWD" -- "cogvideox-5b 0.1 sm90_128x128_w12_s3" \
  "cogvideox-5b 1.0 sm90_128x128_w12_s3" "wan-1.3b-480p 0.1 sm90_128x128_w12_s3" \
  "hunyuan-720p 0.1 sm90_128x128_w12_s3" | tee "$out/ab_fence.txt"
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 150 python3 -m tessera bench --shape $s --case random-10,random-30,band-16,dense \
    --regime "sm80_128x64_w4_s2[combine_threshold=0.0]" --reps 10 --json "$out/bench_sm80_$s.json" \
    > "$out/bench_sm80_$s.txt" 2>/dev/null
  echo "bench $s rc=$?"; cat "$out/bench_sm80_$s.txt"
done
