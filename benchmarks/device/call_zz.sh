#!/usr/bin/env bash
# Prepared in the eighth session on branch tma; ran in the ninth (14 failures, fixed:
# call_zz2.sh). The producer copies Q and K/V by
# TMA (one thread; tensor maps encoded through the driver, tessera/cuda/tma.py), which leaves
# the consumers 240 registers (P V overlaps the softmax at head dim 128 with 128-key steps too).
# Before running, unpack main beside the checkout (untracked):
#   rm -rf ab_main && mkdir ab_main && git archive main tessera benchmarks/sweep.py | tar -x -C ab_main
# 1. smoke probe under a short timeout (a hang shows at once: the default regimes take TMA);
# 2. the TMA tests (equal to cp.async bit for bit, fallback strides), the whole suite, racecheck
#    and memcheck on the TMA tests;
# 3. kernel times, main (cp.async) against the branch, alternating.
set -uo pipefail
. benchmarks/device/common.sh
timeout 60 python3 benchmarks/device/probe_bisect.py $PWD 2>&1 | tail -6
start=$(date +%s)
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  tests/test_tma.py -k "tma" > "$out/tma_tests.txt" 2>&1
rc=$?
echo "tma tests rc=$rc $(( $(date +%s) - start ))s: $(tail -1 "$out/tma_tests.txt")"
grep -E "^(FAILED|E ) " "$out/tma_tests.txt" | head -10
[ $rc -eq 124 ] && { echo "the TMA tests HUNG"; exit 1; }
gpu_tests gpu_tests 200 tests --maxfail=20
sanitize racecheck 60 "tma_copies and 128-128-64"
sanitize memcheck 60 "tma_copies and (128-128-128 or 64-64-64)"
ab_sweep 2 "pack_keys|align" ab_main "$PWD" -- "wan-1.3b-480p 0.1 sm90_128x128_w12_s3" \
  "wan-1.3b-480p 1.0 sm90_128x128_w12_s3" "cogvideox-5b 0.1 sm90_128x128_w12_s3" \
  "cogvideox-5b 1.0 sm90_128x128_w12_s3" | tee "$out/ab_tma.txt"
