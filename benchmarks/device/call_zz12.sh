#!/usr/bin/env bash
# Tenth session: the aligned default's pair estimate as one kernel (plan.cu tiling_pairs, one
# launch and a 16-byte copy) instead of ~15 array operations, which cost ~1 ms of the semantic
# clusters' request (call_zz10.sh / call_zz11.sh: plan 1.35-1.45 ms against 0.39 forced).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests aligned 90 tests/test_attention_gpu.py -k "tiling_pairs or aligned_tiles_chosen"
sanitize memcheck 60 "tiling_pairs"
timeout 100 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b \
  --family semantic_clusters,random_blocks --reps 10 > "$out/bench_default.txt" 2>/dev/null
echo "bench rc=$?"; cat "$out/bench_default.txt"
