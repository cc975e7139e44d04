#!/usr/bin/env bash
# Prepared in the eighth session, NOT yet run: Regime.align_tiles (tiles straddling variable
# query blocks) and the packed-walk default on ragged key geometry, on the H200.
# 1. smoke probe (a hang shows at once), the aligned-tile GPU tests, the whole GPU suite;
# 2. memcheck on the aligned and packed tests, racecheck on the 64x64 producer variant (now two
#    CTAs an SM at head dims 64/96); the 64-row regimes on the top-k cubes (64x128 packed,
#    64x64 producer packed and not, against the default 64x64 packed);
# 3. kernel sweep of the semantic clusters (the 128x128 producer regime plain, packed, aligned);
# (The request bench is call_zx.sh: one device call each keeps both under the 10-minute limit.)
set -uo pipefail
. benchmarks/device/common.sh
timeout 60 python3 benchmarks/device/probe_bisect.py $PWD 2>&1 | tail -6
gpu_tests aligned 90 tests/test_attention_gpu.py -k "aligned or packed_keys"
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize memcheck 90 "aligned or packed_keys"
sanitize racecheck 60 "test_packed_keys and 64-64-64-True"  # two 64x64 producer CTAs an SM
for s in cogvideox-5b wan-1.3b-480p; do  # 64-row regimes on the top-k cubes
  timeout 90 python3 benchmarks/sweep.py --shape $s --family topk_pooled --only sm90_64 \
    > "$out/sweep_topk_$s.txt" 2>&1; head -6 "$out/sweep_topk_$s.txt"
done
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 60 python3 benchmarks/sweep.py --shape $s --family semantic_clusters --only sm90_128x128_w12_s3 \
    > "$out/sweep_semantic_$s.txt" 2>&1; head -8 "$out/sweep_semantic_$s.txt"
done
