#!/usr/bin/env bash
# Tenth session, last call: main with the aligned default (select_regime asks align_pays for the
# sm90 heuristic's 128-row regime) and the straddle count fix.
# 1. the whole GPU suite; memcheck and racecheck on the aligned tests (the planner kernel
#    plan_aligned_spans and the aligned default on a device mask);
# 2. the request with the default regime on the semantic clusters (now aligned) and random
#    blocks, against the baselines (compare call_zz6b.sh's forced regimes);
# 3. ncu stall sampling of the portable kernel (dense Wan) for #4's gap to FA2 (call_zz9.sh:
#    issue slots 31% vs FA2's 44%, 6.25 vs 4.33 cycles between issues).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize memcheck 100 "test_aligned_tiles_chosen or (test_aligned_tiles and sm90-128-True)"
sanitize racecheck 60 "test_aligned_tiles and sm90-128-True"
timeout 100 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b \
  --family semantic_clusters,random_blocks --reps 10 > "$out/bench_default.txt" 2>/dev/null
echo "bench rc=$?"; cat "$out/bench_default.txt"
timeout 90 ncu --section WarpStateStats --section SourceCounters -k regex:bsa_fwd --launch-skip 2 \
  --launch-count 1 python3 benchmarks/ncu_one.py 1.0 wan-1.3b-480p sm80_128x64_w4_s2 \
  > "$out/ncu_sm80_stalls.txt" 2>&1
echo "ncu rc=$?"; grep -iE "stall|smsp__pcsamp" "$out/ncu_sm80_stalls.txt" | head -12
