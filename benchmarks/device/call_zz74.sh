#!/usr/bin/env bash
# Eighteenth session: a replan replays the planner's three launches as one CUDA graph (captured
# at the first replan; the mask's rows copied into the graph's buffer). The replan and request
# GPU tests, the persistent / graph / stream tests, memcheck on them, then kept against new
# plans in one process and the host breakdown.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 300 tests/test_attention_gpu.py -k "replan or requests_of_one or stream or graph or persistent or full_size or device_planner"
sanitize memcheck 300 "replan_on_the_device or (requests_of_one_geometry and sm90ws)"
for s in cogvideox-5b wan-1.3b-480p; do
  timeout 200 python3 benchmarks/request_kept.py --shape $s --rounds 20 > "$out/kept_$s.txt" 2>&1
  echo "kept rc=$? $(tail -1 "$out/kept_$s.txt")"
  timeout 120 python3 benchmarks/request_breakdown.py --shape $s --n 300 > "$out/breakdown_$s.txt" 2>&1
  echo "breakdown $s rc=$?"; head -14 "$out/breakdown_$s.txt"
done
