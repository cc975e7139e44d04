#!/usr/bin/env bash
# Seventeenth session, last call: plan_scan's passes 1-3 give each thread a contiguous share
# of the rows/runs (one block scan a pass instead of one per 1024). (1) The planner's GPU
# tests -- on failure the previous plan.cu (call_zz68's, carried as .prev_plan.cu) is put back
# and said so. (2) The request's kernels without cache flush. (3) The rest of the GPU suite.
# (4) memcheck on two planner cases. (5) #4/#5's request bench at 10%, with FlexAttention.
set -uo pipefail
. benchmarks/device/common.sh
planner="planner or sync_free or side_stream or cuda_graph or never_waits or persistent"
gpu_tests planner 300 tests/test_attention_gpu.py -k "$planner"
if ! grep -q " passed" "$out/planner.txt" || grep -q "failed" "$out/planner.txt"; then
  cp .prev_plan.cu tessera/cuda/plan.cu; echo "REVERTED plan.cu to call_zz68's"
  gpu_tests planner_prev 300 tests/test_attention_gpu.py -k "$planner"
fi
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 120 ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum \
    --csv python3 benchmarks/request_kernels.py --shape $s --warm 3 > "$out/rk_$s.csv" 2>/dev/null
  python3 - "$out/rk_$s.csv" "$s" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ki, vi = head.index("Kernel Name"), head.index("Metric Value")
print(sys.argv[2], " ".join(f"{r[ki][:16]}={r[vi]}" for r in rows[-4:]))
PY
done
gpu_tests gpu_tests 240 tests --maxfail=20 -k "not ($planner)"
sanitize memcheck 100 "device_planner_equals_host_planner and (many or variable)"
request_bench 170 --shape wan-1.3b-480p,cogvideox-5b --case random-10 --reps 10
