#!/usr/bin/env bash
# Fourteenth session: where planning a new device mask spends its ~300 us of host time
# (request_phases in call_zz38), under cProfile.
set -uo pipefail
. benchmarks/device/common.sh
for s in cogvideox-5b wan-1.3b-480p; do
  timeout 120 python3 benchmarks/request_hotspots.py --shape $s --what plan --n 500 --top 45 \
    > "$out/hotspots_plan_$s.txt" 2>&1
  echo "== hotspots plan $s rc=$?"; tail -1 "$out/hotspots_plan_$s.txt"
done
timeout 120 python3 benchmarks/request_hotspots.py --shape cogvideox-5b --what request --n 500 \
  --top 45 > "$out/hotspots_request_cogvideox-5b.txt" 2>&1
echo "== hotspots request rc=$?"
