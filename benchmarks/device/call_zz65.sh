#!/usr/bin/env bash
# Seventeenth session: the host-path trims (select_regime remembers geometry-decided answers; a
# mask object's private copy by one memcpy; no counter memset per run -- the persistent kernel
# zeroes its counter at its last ticket; no event wait on the planning stream). (1) The whole
# GPU suite; memcheck/racecheck on the persistent tests. (2) Request times, this tree against
# the session's start (b5f099b), three rounds alternating. (3) Host breakdown of this tree.
# (4) The request's kernels without ncu's cache flush and clock control, both trees.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 280 tests --maxfail=20
sanitize memcheck 150 "persistent or reused_on_one_stream"
sanitize racecheck 150 "test_persistent_ctas_run_many_tasks and 1-64"
mkdir -p .ab/old && git archive b5f099b tessera benchmarks | tar -x -C .ab/old
cp benchmarks/request_kernels.py .ab/old/benchmarks/  # (new this session)
ln -sfn "$PWD" .ab/new
for round in 1 2 3; do
  for t in .ab/old .ab/new; do
    for s in wan-1.3b-480p cogvideox-5b; do
      PYTHONPATH=$t TESSERA_CACHE_DIR=/tmp/tc_$(basename $t) timeout 120 python3 \
        $t/benchmarks/request_hotspots.py --shape $s --what request --n 50 --top 1 2>&1 \
        | tail -1 | sed "s|^|$(basename $t) |" | tee -a "$out/ab_request.txt"
    done
  done
done
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 120 python3 benchmarks/request_breakdown.py --shape $s --n 300 > "$out/breakdown_$s.txt" 2>&1
  echo "== breakdown $s rc=$?"; head -14 "$out/breakdown_$s.txt"
  for t in .ab/old .ab/new; do
    PYTHONPATH=$t TESSERA_CACHE_DIR=/tmp/tc_$(basename $t) timeout 120 ncu --cache-control none \
      --clock-control none --metrics gpu__time_duration.sum --csv python3 \
      $t/benchmarks/request_kernels.py --shape $s --warm 3 > "$out/rk_$(basename $t)_$s.csv" 2>/dev/null
    python3 - "$out/rk_$(basename $t)_$s.csv" "$(basename $t) $s" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
ki, vi = head.index("Kernel Name"), head.index("Metric Value")
print(sys.argv[2], " ".join(f"{r[ki][:16]}={r[vi]}" for r in rows[-5:]))
PY
  done
done
rm -rf .ab
