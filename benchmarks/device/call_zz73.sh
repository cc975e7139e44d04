#!/usr/bin/env bash
# Eighteenth session: what the request's CUDA calls cost alone (launch_overhead.py), and kept
# plans against new plans in one process, alternating (request_kept.py).
set -uo pipefail
. benchmarks/device/common.sh
timeout 120 python3 benchmarks/launch_overhead.py > "$out/launch_overhead.txt" 2>&1
echo "launch_overhead rc=$?"; cat "$out/launch_overhead.txt"
for s in cogvideox-5b wan-1.3b-480p; do
  timeout 200 python3 benchmarks/request_kept.py --shape $s --rounds 20 > "$out/kept_$s.txt" 2>&1
  echo "kept rc=$? $(tail -1 "$out/kept_$s.txt")"
done
