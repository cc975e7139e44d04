#!/usr/bin/env bash
# Seventh session: two Q buffers in the warp-specialized sm90 variant (head dims 64 and 96, and
# 128 with 64-key steps): kernel times, the GPU suite, sanitizers on the persistent tests. (The
# sweep's `_w12_` then matched 128x128_w12_s3 and 128x64_w12_s4; sweep.py has since regained
# call_zj's deeper rings, which it matches too.)
set -uo pipefail
. benchmarks/device/common.sh
for s in "cogvideox-5b 0.1" "cogvideox-5b 0.3" "cogvideox-5b 1.0"; do
  set -- $s
  timeout 100 python3 benchmarks/sweep.py --shape $1 --density $2 --only _w12_ 2>&1 | tee -a "$out/sweep.txt"
done
gpu_tests gpu_suite 420 tests/
sanitize racecheck 90 "persistent_ctas and 3 and 128"
sanitize memcheck 120 "persistent or dtype_headdim"
