#!/usr/bin/env bash
# Tenth session: the aligned default's estimate (mapping.tiling_pairs) put 1 ms on the
# semantic clusters' plan (call_zz10.sh: 1.45 ms against 0.39 forced, call_zz6b.sh): its
# geometry arrays were copied from pageable host memory on every request (each copy waits for
# the stream) and two scalars came back one at a time. Now cached on the device, one sync.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests aligned 90 tests/test_attention_gpu.py -k "tiling_pairs or aligned_tiles_chosen"
timeout 100 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b \
  --family semantic_clusters,random_blocks --reps 10 > "$out/bench_default.txt" 2>/dev/null
echo "bench rc=$?"; cat "$out/bench_default.txt"
