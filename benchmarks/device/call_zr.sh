#!/usr/bin/env bash
# Prepared in the seventh session, NOT yet run (branch overlap-pv): the softmax of chunk j
# overlapping P_{j-1} V_{j-1} (ptxas had closed every iteration with an empty wgmma group, so
# the wait for S_j also waited for the previous P V; see bsa_sm90.cu). Before running, unpack
# main's package beside the checkout (untracked, not committed):
#   rm -rf ab_main && mkdir ab_main && git archive main tessera | tar -x -C ab_main
# Then: the GPU suite and sanitizers on this branch, and kernel times of main against the
# branch, alternating in one machine session.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize racecheck 90 "persistent_ctas and 3 and 128"
sanitize memcheck 120 "persistent or dtype_headdim"
for i in 1 2; do
  for t in ab_main $PWD; do
    for s in "cogvideox-5b 0.1 sm90_128x128_w12_s3" "cogvideox-5b 1.0 sm90_128x128_w12_s3" \
             "cogvideox-5b 0.1 sm90_64x64_w4_s3" "wan-1.3b-480p 0.1 sm90_128x128_w12_s3" \
             "wan-1.3b-480p 0.1 sm90_128x64_w12_s4"; do
      set -- $s
      PYTHONPATH=$t timeout 60 python3 benchmarks/sweep.py --shape $1 --density $2 --only $3 2>&1 \
        | tail -1 | sed "s|^|$(basename $t) |"
    done
  done
done | tee "$out/ab_sweep.txt"
