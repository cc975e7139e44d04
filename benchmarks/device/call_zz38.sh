#!/usr/bin/env bash
# Fourteenth session: the launch's host work. bench's "kernel" is now the GPU time of a burst of
# runs (the host's launch work hidden, as for FlexAttention's and SDPA's calls), "call" a lone
# call as before; request_phases/request_hotspots --what run say where a run's host time goes.
set -uo pipefail
. benchmarks/device/common.sh
for s in cogvideox-5b wan-1.3b-480p; do
  timeout 120 python3 benchmarks/request_phases.py --shape $s --n 300 > "$out/phases_$s.txt" 2>&1
  echo "== phases $s rc=$?"; tail -8 "$out/phases_$s.txt"
done
timeout 120 python3 benchmarks/request_hotspots.py --shape cogvideox-5b --what run --n 500 \
  --top 40 > "$out/hotspots_run.txt" 2>&1
echo "== hotspots run rc=$?"; tail -1 "$out/hotspots_run.txt"
request_bench 240 --shape wan-1.3b-480p,cogvideox-5b --case random-10,random-30,band-16,dense \
  --reps 10
