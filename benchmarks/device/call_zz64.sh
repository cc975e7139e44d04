#!/usr/bin/env bash
# Seventeenth session: plan_scan's pass 5 with the warps' shuffles outside their serial turns
# (plan.cu). The planner's GPU tests; the request's kernels under ncu (plan_scan was 82 us on
# Wan, 183 on CogVideoX in call_zz63); back-to-back and alone request times; the host
# breakdown of a request without cProfile (request_breakdown.py).
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests planner 400 tests/test_attention_gpu.py -k "planner or sync_free or side_stream or cuda_graph or never_waits"
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 120 ncu --metrics gpu__time_duration.sum --csv python3 benchmarks/request_kernels.py \
    --shape $s --warm 3 > "$out/request_kernels_$s.csv" 2> "$out/request_kernels_$s.err"
  echo "== request kernels $s rc=$?"
  python3 - "$out/request_kernels_$s.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ki, vi = head.index("Kernel Name"), head.index("Metric Value")
for r in rows[-4:]:
    print(f"{r[ki][:60]:60} {r[vi]:>12} ns")
PY
  timeout 120 python3 benchmarks/request_breakdown.py --shape $s --n 300 > "$out/breakdown_$s.txt" 2>&1
  echo "== breakdown $s rc=$?"; cat "$out/breakdown_$s.txt"
  timeout 120 python3 benchmarks/request_hotspots.py --shape $s --what request --n 50 --top 5 \
    > "$out/hotspots_$s.txt" 2>&1
  echo "== request $s rc=$?"; tail -1 "$out/hotspots_$s.txt"
done
