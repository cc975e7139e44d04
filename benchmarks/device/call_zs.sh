#!/usr/bin/env bash
# Prepared in the seventh session, NOT yet run (branch key-packing): the packed key walk
# (Regime.pack_keys) -- its GPU tests, memcheck, and kernel times on the top-k cubes and variable
# blocks against the span-by-span walk (benchmarks/sweep.py; `pack_keys=True` in the names).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize memcheck 150 "packed_keys"
for s in wan-1.3b-480p cogvideox-5b; do
  for f in topk_pooled sliding_tile; do
    timeout 120 python3 benchmarks/sweep.py --shape $s --family $f --only sm90_ 2>&1 \
      | tee -a "$out/sweep_packed.txt" | head -8
  done
done
