#!/usr/bin/env bash
# Prepared in the eighth session, NOT yet run: Regime.align_tiles (tiles straddling variable
# query blocks) and the packed-walk default on ragged key geometry, on the H200.
# 1. smoke probe (a hang shows at once), the aligned-tile GPU tests, the whole GPU suite;
# 2. memcheck on the aligned and packed tests;
# 3. kernel sweep of the semantic clusters (plain, packed, aligned 128-row regimes);
# 4. the request bench on random-10 (the bounds cache, 0a03232) and the two families whose
#    default changed (topk_pooled packs now) or may change (semantic_clusters).
set -uo pipefail
. benchmarks/device/common.sh
timeout 60 python3 benchmarks/device/probe_bisect.py $PWD 2>&1 | tail -6
gpu_tests aligned 90 tests/test_attention_gpu.py -k "aligned or packed_keys"
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize memcheck 90 "aligned or packed_keys"
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 60 python3 benchmarks/sweep.py --shape $s --family semantic_clusters --only sm90_128 \
    > "$out/sweep_semantic_$s.txt" 2>&1; head -8 "$out/sweep_semantic_$s.txt"
done
request_bench 240 --shape wan-1.3b-480p,cogvideox-5b --case random-10 \
  --family topk_pooled,semantic_clusters --reps 10
