#!/usr/bin/env bash
# Seventeenth session, first call: call_zz62.sh (prepared last session), then a fresh baseline
# of a request's host path (phases, cProfile) and of its GPU kernels (ncu durations of one
# request's launches), before the host-path work.
set -uo pipefail
. benchmarks/device/common.sh
bash benchmarks/device/call_zz62.sh
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 120 python3 benchmarks/request_phases.py --shape $s --n 300 > "$out/phases_$s.txt" 2>&1
  echo "== phases $s rc=$?"; cat "$out/phases_$s.txt"
  timeout 120 python3 benchmarks/request_hotspots.py --shape $s --what request --n 300 --top 70 \
    > "$out/hotspots_request_$s.txt" 2>&1
  echo "== hotspots $s rc=$?"; tail -1 "$out/hotspots_request_$s.txt"
  # The last request's kernels (launches counted from the end by --launch-skip-before-match is
  # not available: skip the warm-ups' launches, count what is left).
  timeout 120 ncu --metrics gpu__time_duration.sum --csv python3 benchmarks/request_kernels.py \
    --shape $s --warm 3 > "$out/request_kernels_$s.csv" 2> "$out/request_kernels_$s.err"
  echo "== request kernels $s rc=$?"
  python3 - "$out/request_kernels_$s.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ki, vi = head.index("Kernel Name"), head.index("Metric Value")
for r in rows[-8:]:
    print(f"{r[ki][:60]:60} {r[vi]:>12} ns")
PY
done
