#!/usr/bin/env bash
# Seventeenth session: plan_scan's pass 5 a warp per mask head (light runs) and one for the
# heavy runs' list, no block barrier inside it (call_zz67's one-warp walk gained ~3 us of 66).
# (1) The planner's GPU tests. (2) The request's kernels without cache flush. (3) Back-to-back
# and alone request times of this tree.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests planner 400 tests/test_attention_gpu.py -k "planner or sync_free or side_stream or cuda_graph or never_waits or persistent"
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
  for round in 1 2; do
    timeout 120 python3 benchmarks/request_hotspots.py --shape $s --what request --n 50 --top 1 \
      > "$out/req_${s}_$round.txt" 2>&1
    echo "rc=$? $(tail -1 "$out/req_${s}_$round.txt")"
  done
done
