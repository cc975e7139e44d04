#!/usr/bin/env bash
# Twelfth session: the launch order "heavy tasks first, then one mask head at a time"
# (tasks.launch_keys, plan.cu plan_scan): the GPU suite, memcheck on the planner tests, and the
# task_order experiment again on the default regime (the planner's order is now the new one).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 300 tests --maxfail=20
sanitize memcheck 150 "planner or sync_free"
for s in wan-1.3b-480p hunyuan-720p cogvideox-5b; do
  timeout 60 python3 benchmarks/task_order.py --shape $s --density 0.1 2>&1 | tee -a "$out/task_order.txt"
done
