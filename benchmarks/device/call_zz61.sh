#!/usr/bin/env bash
# Sixteenth session, last call: head dim 64's default becomes the 64x128 producer tile, two CTAs
# an SM (call_zz55/zz56: as fast or faster on every CogVideoX mask), its cp.async form (packed
# keys, or operands TMA cannot describe) now also two CTAs an SM (spill-free since this
# session's walk changes); aligned tiles stay 128-row. (1) The whole GPU suite. (2) memcheck and
# racecheck on the two-CTA tests. (3) #5's bench on CogVideoX with the new default.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 280 tests --maxfail=20
sanitize memcheck 120 "test_two_64_row_producer_ctas_an_sm"
sanitize racecheck 120 "test_two_64_row_producer_ctas_an_sm and 64-128-False-False"
request_bench 200 --shape cogvideox-5b --case random-10,random-30,band-16,dense \
  --family sliding_tile,spatial_temporal,semantic_clusters --reps 10
