#!/usr/bin/env bash
# Prepared at the end of the thirteenth session, NOT yet run. Validates main at 8a9eab5+ on a
# fresh machine: the whole GPU suite (call_zz33 ran it with the wide step on by default,
# call_zz34 only the D=64 subset of the final tree), then repeats call_zz34's A/B with the
# order reversed -- this tree first, the tree before the change (a7da019) second -- to check
# that the default D=64 kernel's gain (1-15%) is not the order of the runs. Put a7da019 beside
# the tree first: mkdir -p .ab/old && git archive a7da019 tessera benchmarks | tar -x -C .ab/old
# (untracked; delete after).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
base="sm90_128x128_w12_s3[combine_threshold=0.0]"
for round in 1 2; do
  for c in "--density 1.0" "--density 0.1" "--density 0.3" "--family spatial_temporal" \
           "--family sliding_tile"; do
    timeout 40 python3 benchmarks/sweep.py --shape cogvideox-5b $c --regime "$base" 2>&1 \
      | tail -1 | sed "s|^|new |" | tee -a "$out/ab_order.txt"
    PYTHONPATH=$PWD/.ab/old timeout 40 python3 .ab/old/benchmarks/sweep.py --shape cogvideox-5b \
      $c --regime "$base" 2>&1 | tail -1 | sed "s|^|old |" | tee -a "$out/ab_order.txt"
  done
done
request_bench 200 --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense \
  --reps 10
