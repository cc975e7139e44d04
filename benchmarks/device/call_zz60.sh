#!/usr/bin/env bash
# Sixteenth session, at c8f8ecc (the packed gather and the consumers' key count): the whole GPU
# suite; #5's cube ratio (64-token top-k cubes against random 10% of 128-token blocks) in one
# bench run per shape; the README's demo.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 280 tests --maxfail=20
request_bench 200 --shape wan-1.3b-480p,cogvideox-5b --case random-10 \
  --family topk_pooled,sliding_tile --reps 10
timeout 150 python3 -m tessera demo > "$out/demo.txt" 2>&1; echo "demo rc=$?"; cat "$out/demo.txt"
