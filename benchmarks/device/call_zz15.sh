#!/usr/bin/env bash
# Eleventh session, first call: main (32fd62e, never run on a GPU) plus the portable kernel's
# chunk copies with one 64-bit add a row (whole chunks) instead of a clamp and two multiplies.
# 1. the whole GPU suite; memcheck and racecheck on the aligned tests;
# 2. kernel A/B of the portable family: the file at 32fd62e (.ab/bsa_sm80_base.cu), this tree,
#    and .ab/bsa_sm80_B.cu (this tree plus one barrier a chunk: the prefetch issued after the
#    wait; it spills 24 bytes, so it is a measurement, not a candidate).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 230 tests --maxfail=20
sanitize memcheck 100 "test_aligned_tiles_chosen or (test_aligned_tiles and sm90-128-True) or (test_variable_blocks_and_empty_rows and sm80)"
sanitize racecheck 60 "test_aligned_tiles and sm90-128-True"
for v in base B; do
  mkdir -p /tmp/ab_$v && cp -r tessera benchmarks /tmp/ab_$v/ && cp .ab/bsa_sm80_$v.cu /tmp/ab_$v/tessera/cuda/bsa_sm80.cu
done
ab_sweep 2 "pack_keys|align" /tmp/ab_base "$PWD" /tmp/ab_B -- "wan-1.3b-480p 1.0 sm80_128x64_w4_s2" \
  "wan-1.3b-480p 0.1 sm80_128x64_w4_s2" "cogvideox-5b 0.1 sm80_64x64_w4_s2" | tee "$out/ab_sm80.txt"
