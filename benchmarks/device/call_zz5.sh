#!/usr/bin/env bash
# Ninth session, last call: aligned tiles chosen automatically (mapping.tiling_pairs) -- the
# aligned GPU tests and the new default's test, then the semantic clusters (and random blocks,
# which must not change) against the baselines, plan time included.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests aligned 90 tests/test_attention_gpu.py -k "aligned"
request_bench 150 --shape wan-1.3b-480p,cogvideox-5b --family semantic_clusters,random_blocks \
  --reps 10
