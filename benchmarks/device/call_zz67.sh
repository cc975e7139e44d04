#!/usr/bin/env bash
# Seventeenth session: plan_scan's pass 5 walked by one warp (no block barrier a turn) and
# pass 2's four scans as one; the loader waives a missing ptxas report whatever else the log
# holds (call_zz66: NVRTC left it out for a program built before on the machine, and every
# CogVideoX request of the copied new tree failed). (1) The planner's GPU tests. (2) The
# request's kernels without cache flush, both shapes. (3) The request A/B against the
# session's start (b5f099b), copied trees, three rounds alternating.
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
done
mkdir -p .ab/old .ab/new
git archive b5f099b tessera benchmarks tables | tar -x -C .ab/old
git ls-files -z tessera benchmarks tables | xargs -0 tar -c | tar -x -C .ab/new
for round in 1 2 3; do
  for t in .ab/old .ab/new; do
    for s in wan-1.3b-480p cogvideox-5b; do
      log="$out/ab_$(basename $t)_${s}_$round.txt"
      PYTHONPATH=$t TESSERA_CACHE_DIR=/tmp/tc_$(basename $t) timeout 120 python3 \
        $t/benchmarks/request_hotspots.py --shape $s --what request --n 50 --top 1 > "$log" 2>&1
      echo "$(basename $t) rc=$? $(tail -1 "$log")"
    done
  done
done
rm -rf .ab
