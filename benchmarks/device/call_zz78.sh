#!/usr/bin/env bash
# Eighteenth session: where a request's remaining host time goes, line by line
# (benchmarks/line_times.py), Wan at 10%, kept plans.
set -uo pipefail
. benchmarks/device/common.sh
cd benchmarks
for spec in "request tessera.api.attention" "request tessera.api._launch_here" \
            "run tessera.api._launch_here" "request tessera.api._describe" \
            "request tessera.mask.BlockMask.from_dense" "request tessera.runtime.plan.Plan.replan"; do
  read -r what fn <<< "$spec"
  timeout 120 python3 line_times.py --what $what --function $fn --n 300 --top 14 \
    > "$out/lines_${what}_${fn##*.}.txt" 2>&1
  echo "== rc=$?"; cat "$out/lines_${what}_${fn##*.}.txt" | head -16
done
