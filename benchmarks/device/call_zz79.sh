#!/usr/bin/env bash
# Eighteenth session: the host trims call_zz78's line times pointed at (a torch mask copied
# straight from its memory, the output described from what was asked for, the plan's and the
# strides' kernel arguments made once, the persistent grid cached per device). The whole GPU
# suite, kept against new plans, and the line times again.
set -uo pipefail
. benchmarks/device/common.sh
gpu_tests gpu_tests 300 tests --maxfail=10
for s in cogvideox-5b wan-1.3b-480p; do
  timeout 200 python3 benchmarks/request_kept.py --shape $s --rounds 15 > "$out/kept_$s.txt" 2>&1
  echo "kept rc=$? $(tail -1 "$out/kept_$s.txt")"
done
cd benchmarks
for spec in "request tessera.api._launch_here" "request tessera.mask.BlockMask.from_dense"; do
  read -r what fn <<< "$spec"
  timeout 120 python3 line_times.py --what $what --function $fn --n 300 --top 8 \
    > "$out/lines_${what}_${fn##*.}.txt" 2>&1
  echo "== rc=$?"; head -10 "$out/lines_${what}_${fn##*.}.txt"
done
