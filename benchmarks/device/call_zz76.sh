#!/usr/bin/env bash
# Eighteenth session, final tree on one H200: the whole GPU suite, memcheck on the request
# reuse test, kept against new plans, and #4/#5's request bench at 10%.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 400 tests --maxfail=20
sanitize memcheck 300 "requests_of_one_geometry and sm90ws"
for s in cogvideox-5b wan-1.3b-480p; do
  timeout 200 python3 benchmarks/request_kept.py --shape $s --rounds 20 > "$out/kept_$s.txt" 2>&1
  echo "kept rc=$? $(tail -1 "$out/kept_$s.txt")"
done
request_bench 170 --shape wan-1.3b-480p,cogvideox-5b --case random-10 --reps 10
