#!/usr/bin/env bash
# Seventh session: the host-path trims (planner scratch as raw pointers, torch's raw stream
# query, cached table path and bounds) -- GPU suite, then where a request's host time goes and
# the request bench at 10%.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 200 tests --maxfail=20
python3 benchmarks/request_hotspots.py --shape cogvideox-5b --n 300 --top 40 > "$out/hotspots.txt" 2>&1; tail -1 "$out/hotspots.txt"
for s in wan-1.3b-480p cogvideox-5b; do
  timeout 60 python3 benchmarks/request_phases.py --shape $s --n 200 > "$out/phases_$s.txt" 2>&1
  echo "== $s rc=$?"; cat "$out/phases_$s.txt"
done
timeout 200 python3 -m tessera bench --shape wan-1.3b-480p,cogvideox-5b --case random-10 --reps 10 \
  --json "$out/bench.json" > "$out/bench.txt" 2>"$out/bench_err.txt"
echo "bench rc=$?"; cat "$out/bench.txt"
