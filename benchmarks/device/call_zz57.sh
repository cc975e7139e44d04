#!/usr/bin/env bash
# Sixteenth session. call_zz56's gather (two adjacent threads a row, 32 bytes of 16 rows a copy
# instruction) ran the top-k cubes 22-25% slower than 68fe0e9's (16 threads a row). Here: PPC
# adjacent threads a row, each copying one piece of each 128-byte column chunk, so a copy
# instruction reads whole lines (four rows) as before, while a thread finds the key and
# addresses of 4 rows a chunk instead of 8 (head dim 128; at 64 the layout is the old one).
# .ab/old = 68fe0e9. (1) Kernel-only A/B on the cubes, alternating, two rounds. (2) The packed
# GPU tests; memcheck on the packed producer ones.
set -uo pipefail
. benchmarks/device/common.sh
ln -sfn "$PWD" .ab/new
ab_sweep 2 "^$" .ab/old .ab/new -- \
  "wan-1.3b-480p family:topk_pooled sm90_64x64_w8_s3[combine_threshold=0.0,pack_keys=True]" \
  "cogvideox-5b family:topk_pooled sm90_64x64_w4_s3[combine_threshold=0.0,pack_keys=True]" \
  | tee "$out/ab_gather.txt"
rm -f .ab/new
gpu_tests gpu_tests 200 tests/test_attention_gpu.py -k "pack or two_64_row or three_consumer or topk"
sanitize memcheck 240 "test_two_64_row_producer_ctas_an_sm or (test_packed_keys and 64-64)"
