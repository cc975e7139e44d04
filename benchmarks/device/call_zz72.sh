#!/usr/bin/env bash
# Eighteenth session: tessera.attention keeps a sync-free plan per (geometry, shapes, stream)
# and replans it for the next request's mask (Plan.replan: the planner kernels alone). The GPU
# suite (new: test_replan_on_the_device_equals_a_new_plan, test_requests_of_one_geometry_reuse
# _a_plan), memcheck on the request test, then request times with kept plans against new plans
# in one tree (processes alternating), the host breakdown, and the bench at 10%.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 300 tests --maxfail=20
sanitize memcheck 300 "requests_of_one_geometry and sm90ws"
for round in 1 2; do
  for mode in "--new-plans" ""; do
    for s in wan-1.3b-480p cogvideox-5b; do
      timeout 120 python3 benchmarks/request_hotspots.py --shape $s --what request --n 50 \
        --top 1 $mode > "$out/hot_${s}_${mode:-kept}_$round.txt" 2>&1
      echo "rc=$? $(tail -1 "$out/hot_${s}_${mode:-kept}_$round.txt")"
    done
  done
done
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 120 python3 benchmarks/request_breakdown.py --shape $s --n 300 > "$out/breakdown_$s.txt" 2>&1
  echo "breakdown $s rc=$?"; head -16 "$out/breakdown_$s.txt"
done
request_bench 170 --shape wan-1.3b-480p,cogvideox-5b --case random-10 --reps 10
cd "$out" && tar -czf all.tgz --exclude all.tgz . && find . -maxdepth 1 -type f ! -name all.tgz -delete
