#!/usr/bin/env bash
# Seventh session: A/B of the request path's host time, the tree before the host trims (commit
# 0fdd344, unpacked into ab_old/ beside the checkout, not committed) against HEAD, alternating
# in one machine session (host timings drift up to 2x between sessions).
set -uo pipefail
. benchmarks/device/common.sh
for i in 1 2 3; do
  for t in ab_old $PWD; do
    for s in cogvideox-5b wan-1.3b-480p; do
      PYTHONPATH=$t timeout 60 python3 benchmarks/request_phases.py --shape $s --n 200 > "$out/ab_$(basename $t)_${s}_$i.txt" 2>&1
      echo "$(basename $t) $s run $i: $(grep -E 'host' "$out/ab_$(basename $t)_${s}_$i.txt" | awk '{print $(NF-2)}' | tr '\n' ' ') | $(tail -1 "$out/ab_$(basename $t)_${s}_$i.txt" | grep -oE 'request alone [0-9.]+ ms')"
    done
  done
done
