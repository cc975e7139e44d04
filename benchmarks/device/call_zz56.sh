#!/usr/bin/env bash
# Sixteenth session. Tree = main with the packed gather reworked (bsa_sm90.cu load_kv): a row
# of a 64-key chunk (or of any step with at least two loading threads a row) is copied by two or
# four adjacent threads that find its key and addresses once, with immediate offsets per piece,
# instead of every thread walking the spans for each of its eight rows (call_zz55's ncu: the
# producer's gather bounds the 64-token cubes). .ab/old = 68fe0e9 (git archive).
# (1) GPU suite (packed keys now also at head dim 96); memcheck and racecheck on the packed
# producer tests. (2) Kernel-only A/B on the top-k cubes (Wan: 64x64 w8 producer; CogVideoX:
# 64x64 w4 plain), alternating, two rounds. (3) #5's cube ratio in one bench run. (4) The 64x128
# two-CTA variant against CogVideoX's default on the masks call_zz55 did not time.
set -uo pipefail
. benchmarks/device/common.sh
ln -sfn "$PWD" .ab/new
ab_sweep 2 "^$" .ab/old .ab/new -- \
  "wan-1.3b-480p family:topk_pooled sm90_64x64_w8_s3[combine_threshold=0.0,pack_keys=True]" \
  "cogvideox-5b family:topk_pooled sm90_64x64_w4_s3[combine_threshold=0.0,pack_keys=True]" \
  | tee "$out/ab_gather.txt"
rm -f .ab/new
gpu_tests gpu_tests 280 tests --maxfail=20
sanitize memcheck 240 "test_two_64_row_producer_ctas_an_sm or (test_packed_keys and 64-64)"
sanitize racecheck 150 "test_two_64_row_producer_ctas_an_sm and True"
request_bench 240 --shape wan-1.3b-480p,cogvideox-5b --case random-10 --family topk_pooled \
  --reps 10
d="sm90_128x128_w12_s3[combine_threshold=0.0]"
new="sm90_64x128_w8_s3[combine_threshold=0.0]"
for round in 1 2; do
  if [ $round = 1 ]; then a=$d; b=$new; else a=$new; b=$d; fi
  for what in "--density 0.3" "--density 1.0" "--family sliding_tile" "--family radial"; do
    timeout 90 python3 benchmarks/sweep.py --shape cogvideox-5b $what --regime "$a" \
      --regime "$b" 2>&1 | tail -2 | tee -a "$out/ab_64x128.txt"
  done
done
