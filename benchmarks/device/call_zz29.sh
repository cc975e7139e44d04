#!/usr/bin/env bash
# Twelfth session: the launch order one (batch, head) assignment at a time (a mask shared by all
# heads is now taken head by head too; plan.cu plan_scan/plan_write_runs place each light run's
# tiles under every assignment). The GPU suite, memcheck on the planner tests, then
# task_order.py with one random mask for all heads: the planner's order against longest first.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 220 tests --maxfail=20
sanitize memcheck 60 "device_planner_equals_host"
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 60 python3 benchmarks/task_order.py --shape $s --density 0.1 --broadcast 2>&1 | tee -a "$out/task_order.txt"
done
