#!/usr/bin/env bash
# Sixteenth session. Tree = main (0e93c98) with the consumers' side of the packed walk reduced
# to a count (common.cuh PackedCount: the task's keys summed once by a warp's lanes, each chunk
# BN keys but the last; the row restriction read once a task) instead of walking the spans chunk
# by chunk (call_zz58's ncu: ~5% of samples on those loads once the producer kept up).
# .ab/old = 0e93c98. (1) Kernel-only A/B on the top-k cubes, alternating, two rounds. (2) The
# packed GPU tests; memcheck on packed producer and plain tests; racecheck on the plain packed
# variant (its loaders are its consumers).
set -uo pipefail
. benchmarks/device/common.sh
ln -sfn "$PWD" .ab/new
ab_sweep 2 "^$" .ab/old .ab/new -- \
  "wan-1.3b-480p family:topk_pooled sm90_64x64_w8_s3[combine_threshold=0.0,pack_keys=True]" \
  "cogvideox-5b family:topk_pooled sm90_64x64_w4_s3[combine_threshold=0.0,pack_keys=True]" \
  | tee "$out/ab_count.txt"
rm -f .ab/new
gpu_tests gpu_tests 200 tests/test_attention_gpu.py -k "pack or two_64_row or three_consumer or topk"
sanitize memcheck 240 "test_two_64_row_producer_ctas_an_sm or (test_packed_keys and 64-64)"
sanitize racecheck 200 "test_packed_keys and 64-64-64-False"
