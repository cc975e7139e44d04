#!/usr/bin/env bash
# Seventh session: two Q buffers in the warp-specialized sm90 variant (head dims 64 and 96, and
# 128 with 64-key steps): the GPU suite, sanitizers on the persistent tests, then kernel times.
set -uo pipefail
. benchmarks/device/common.sh
for s in "cogvideox-5b 0.1" "cogvideox-5b 0.3" "cogvideox-5b 1.0"; do
  set -- $s
  timeout 100 python3 benchmarks/sweep.py --shape $1 --density $2 --only _w12_ 2>&1 | tee -a "$out/sweep.txt"
done
gpu_tests gpu_suite 420 tests/
timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "persistent_ctas and 3 and 128" > "$out/sanitizer.txt" 2>&1
echo "racecheck rc=$?: $(grep -E 'RACECHECK SUMMARY|passed|failed' $out/sanitizer.txt | tail -2 | tr '\n' ' ')"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_attention_gpu.py \
  -k "persistent or dtype_headdim" >> "$out/sanitizer.txt" 2>&1
echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY|passed|failed' $out/sanitizer.txt | tail -2 | tr '\n' ' ')"
