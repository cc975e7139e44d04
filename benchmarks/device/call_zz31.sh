#!/usr/bin/env bash
# Prepared at the end of the twelfth session, NOT yet run: validates the heavy-task rule's
# device part (plan.cu heavy_task: tasks over twice the mean launch first) -- the GPU suite,
# memcheck on the planner cases -- then measures the launch order on model masks with text
# rows (planner vs longest first, one plan relaunched), where it risks a tail
# (benchmarks/order_makespan.py) and where L2 reuse may matter less than on random masks.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 240 tests --maxfail=20
sanitize memcheck 160 "device_planner_equals_host or sync_free"
for s in hunyuan-720p cogvideox-5b; do
  for f in sliding_tile spatial_temporal; do
    timeout 90 python3 benchmarks/task_order.py --shape $s --family $f 2>&1 | tee -a "$out/task_order.txt"
  done
done
