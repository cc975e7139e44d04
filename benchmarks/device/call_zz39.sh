#!/usr/bin/env bash
# Fourteenth session: a prepared plan's run costs 197-301 us of host time (call_zz38; 105-123 us
# in the sixth session) -- each step of api._launch timed alone.
set -uo pipefail
. benchmarks/device/common.sh
for s in cogvideox-5b wan-1.3b-480p; do
  timeout 120 python3 benchmarks/launch_costs.py --shape $s > "$out/launch_costs_$s.txt" 2>&1
  echo "== $s rc=$?"; cat "$out/launch_costs_$s.txt" | tail -22
done
